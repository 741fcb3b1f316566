"""Host time of a patched training step against eager torch, on a machine with no GPU: the
path CUDA tensors take through dnnctl with every dnnctl kernel launch a no-op
(benchmarks/stub_gpu.py), torch's own ops running for real on tiny CPU tensors.

Parts (``--parts``), all under bfloat16 autocast on channels-last tensors, the
patched model as ``bench_train.py --backward plan+batch_norm=dnnctl`` patches it (no plan:
convolutions and the linear run torch's own calls, every BatchNorm + ReLU (+ residual) one
dnnctl batch_norm call, its backward dnnctl's):

- ``ops``: host us per op, forward and backward apart, eager against patched: a chain of
  ``--depth`` copies of one block (a 3x3 conv; BatchNorm + ReLU; a block's end
  BatchNorm + residual + ReLU; a plain BatchNorm) timed against a chain of one, the
  difference divided by depth - 1 (what the engine and autocast pay once per call is left
  out); 8 channels, 8 x 8, batch 2;
- ``step``: a ResNet-50 with every layer in place (16 bottlenecks, 53 conv + BN) at 1/8
  of its widths (``--base``), batch 2, 64 x 64: forward + cross-entropy + backward, ms a
  step (no optimizer: it is the same for both);
- ``floor`` (not run by default): the step with every fused BatchNorm's forward an empty
  autograd Function (allocations, saved tensors, the running count; no dnnctl dispatch):
  the Python Function's own cost, the floor of this design;
- ``paths``: where one patched step's calls went (torch's own calls, dnnctl's backward
  kernels): the routes a GPU run takes;
- ``profile``: cProfile of ``--profile-steps`` patched steps, the functions with the most
  own time per step (cProfile inflates every Python call about equally: read the shares).

Medians of ``--reps`` rounds (``--clock cpu``: the thread's CPU time, not wall time, for a
machine other work shares). The numbers are CPU host time with stub kernels: they
compare Python paths on this machine, they are not GPU times (stub_gpu.py says what is
left out).

    PYTHONPATH=. python3 benchmarks/bench_train_host_cpu.py [--parts ops,step,paths,profile]
        [--reps 7] [--iters 200] [--depth 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import stub_gpu  # noqa: E402

BACKWARD = {"*": "plan", "batch_norm": "dnnctl"}


def _torch() -> Any:
    import torch

    torch.set_flush_denormal(True)  # stub outputs hold whatever memory held: no slow floats
    return torch


def _blocks() -> list[tuple[str, Callable[[], Any]]]:
    """(label, block factory): each block maps (2, 8, 8, 8) to the same shape."""
    from torch import nn

    class BnAddRelu(nn.Module):
        """A bottleneck's end: relu(bn(x) + identity)."""

        def __init__(self, c: int) -> None:
            super().__init__()
            self.bn, self.relu = nn.BatchNorm2d(c), nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            out = self.bn(x)
            out += x
            return self.relu(out)

    c = 8
    return [
        ("conv3x3", lambda: nn.Conv2d(c, c, 3, padding=1, bias=False)),
        ("bn+relu", lambda: nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True))),
        ("bn+add+relu", lambda: BnAddRelu(c)),
        ("bn", lambda: nn.BatchNorm2d(c)),
    ]


def _prepare(model: Any, patched: bool) -> Any:
    import torch

    import dnnctl.torch as dt

    model = model.to(memory_format=torch.channels_last).train()
    if patched:
        dt.patch(model, None, backward=BACKWARD)
    return model


CLOCK = [time.perf_counter]  # --clock: wall time, or this thread's CPU time


def _timed(model: Any, x: Any, loss: Callable[[Any], Any] | None, iters: int
           ) -> tuple[float, float]:
    """Mean host us of (forward, backward) over ``iters`` iterations."""
    torch = _torch()
    clock = CLOCK[0]
    grad = None
    fwd = bwd = 0.0
    for _ in range(iters):
        t0 = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
            if loss is not None:
                y = loss(y)
        t1 = clock()
        if grad is None:
            grad = torch.ones_like(y)
        y.backward(grad)
        t2 = clock()
        fwd += t1 - t0
        bwd += t2 - t1
    return fwd / iters * 1e6, bwd / iters * 1e6


def _median_pair(fn: Callable[[], tuple[float, float]], reps: int) -> tuple[float, float]:
    runs = [fn() for _ in range(reps)]
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))


def ops(reps: int, iters: int, depth: int) -> list[dict[str, Any]]:
    """Per-op host us, forward and backward, eager and patched (see the module doc)."""
    torch = _torch()
    from torch import nn

    x = torch.randn(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)
    rows = []
    for label, make in _blocks():
        row: dict[str, Any] = {"op": label}
        for way in ("eager", "patched"):
            torch.manual_seed(0)
            chains = {d: _prepare(nn.Sequential(*(make() for _ in range(d))), way != "eager")
                      for d in (1, depth)}
            for m in chains.values():  # warm: sites, kernels and routes are made once
                _timed(m, x, None, 5)
            # interleaved, so drifts of the machine hit both chains alike
            pairs: dict[int, list[tuple[float, float]]] = {1: [], depth: []}
            for _ in range(reps):
                for d, m in chains.items():
                    pairs[d].append(_timed(m, x, None, iters))
            f1 = statistics.median(p[0] for p in pairs[1])
            b1 = statistics.median(p[1] for p in pairs[1])
            fd = statistics.median(p[0] for p in pairs[depth])
            bd = statistics.median(p[1] for p in pairs[depth])
            row[f"{way}_fwd"] = (fd - f1) / (depth - 1)
            row[f"{way}_bwd"] = (bd - b1) / (depth - 1)
        row["extra_us"] = (row["patched_fwd"] + row["patched_bwd"]
                           - row["eager_fwd"] - row["eager_bwd"])
        rows.append(row)
    return rows


def resnet(base: int) -> tuple[Any, Any, Any]:
    """(model factory, input, loss) of the step part."""
    torch = _torch()
    import models
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, 64, generator=g).contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (2,), generator=g)

    def make() -> Any:
        torch.manual_seed(0)
        return models.ResNet50(10, base=base)

    return make, x, lambda y: F.cross_entropy(y.float(), target)


def step(reps: int, iters: int, base: int) -> list[dict[str, Any]]:
    """ms per step (forward, backward, both), eager and patched."""
    make, x, loss = resnet(base)
    models = {"eager": _prepare(make(), False), "patched": _prepare(make(), True)}
    for m in models.values():
        _timed(m, x, loss, 3)
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in models}
    for _ in range(reps):
        for way, m in models.items():
            got[way].append(_timed(m, x, loss, iters))
    rows = []
    for way, runs in got.items():
        f = statistics.median(r[0] for r in runs) / 1e3
        b = statistics.median(r[1] for r in runs) / 1e3
        rows.append({"way": way, "fwd_ms": f, "bwd_ms": b, "step_ms": f + b})
    return rows


def floor(reps: int, iters: int, base: int) -> list[dict[str, Any]]:
    """ms per step of eager, patched, and patched with every fused BatchNorm's forward an
    empty autograd Function (its three outputs allocated and saved, the running count
    updated; no dnnctl dispatch or launch, a backward that allocates its gradients): what
    the Python autograd Function costs by itself, the floor of this design."""
    torch = _torch()
    from dnnctl.torch import fuse

    class Bare(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, b: Any, z: Any, rm: Any) -> Any:
            y = torch.empty_like(x, memory_format=torch.channels_last)
            mean, invstd = rm.new_empty(rm.shape), rm.new_empty(rm.shape)
            ctx.save_for_backward(x, w, b, z, mean, invstd, y)
            return y

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            x, w, b, z, _, _, _ = ctx.saved_tensors
            return (torch.empty_like(x), w.new_empty(w.shape), b.new_empty(b.shape),
                    None if z is None else torch.empty_like(z), None)

    def bare(self: Any, x: Any, residual: Any = None) -> Any:
        bn = self._modules["bn"]
        y = Bare.apply(x, bn.weight, bn.bias, residual, bn.running_mean)
        bn.num_batches_tracked.add_(1)
        return y

    real = fuse.FusedBnAct.forward
    make, x, loss = resnet(base)
    models = {"eager": _prepare(make(), False), "patched": _prepare(make(), True),
              "floor": _prepare(make(), True)}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in models}
    try:
        for rnd in range(reps + 1):
            for way, m in models.items():
                fuse.FusedBnAct.forward = bare if way == "floor" else real
                if rnd:
                    got[way].append(_timed(m, x, loss, iters))
                else:
                    _timed(m, x, loss, 3)
    finally:
        fuse.FusedBnAct.forward = real
    return [{"way": way, "step_ms": statistics.median(r[0] + r[1] for r in runs) / 1e3}
            for way, runs in got.items()]


def paths(base: int) -> dict[str, Any]:
    """Where one patched step's calls went (what the H100's log of bench_train shows for
    ResNet-50: every conv torch's own call, the fused BatchNorms' backward dnnctl's; this
    model's small linear is one the default gives dnnctl's own GEMM)."""
    from dnnctl.torch import grad_plan, kernels

    make, x, loss = resnet(base)
    m = _prepare(make(), True)
    _timed(m, x, loss, 1)
    grad_plan.BACKWARD_PATHS.clear()
    kernels.VENDOR_VIA_TORCH.clear()
    kernels.FALLBACKS.clear()
    _timed(m, x, loss, 1)
    return {"vendor_via_torch": dict(kernels.VENDOR_VIA_TORCH),
            "fallbacks": {f"{op}: {why}": n for (op, why), n in kernels.FALLBACKS.items()},
            "backward": grad_plan.paths_summary()}


def profile(steps: int, base: int, top: int) -> list[dict[str, Any]]:
    """The functions with the most own time in a patched step (per step)."""
    make, x, loss = resnet(base)
    m = _prepare(make(), True)
    _timed(m, x, loss, 3)
    prof = cProfile.Profile()
    prof.enable()
    _timed(m, x, loss, steps)
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_, nc, tt, ct, _) in sorted(st.stats.items(),
                                                          key=lambda kv: -kv[1][2])[:top]:
        where = f"{Path(file).name}:{line}" if line else file
        rows.append({"function": f"{name} ({where})", "own_us": tt / steps * 1e6,
                     "cum_us": ct / steps * 1e6, "calls": nc / steps})
    return rows


def _table(rows: list[dict[str, Any]], fmt: str = "{:.2f}") -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(fmt.format(v) if isinstance(v, float) else str(v)
                                     for v in r.values()) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="ops,step,paths,profile")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200, help="iterations a round (ops)")
    ap.add_argument("--step-iters", type=int, default=10, help="steps a round (step)")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--base", type=int, default=8, help="ResNet-50's first width (64 real)")
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this thread's CPU time (a shared, loaded machine)")
    ap.add_argument("--json", help="write every table here too")
    a = ap.parse_args(argv)
    CLOCK[0] = time.thread_time if a.clock == "cpu" else time.perf_counter
    parts = a.parts.split(",")
    torch = _torch()
    torch.set_num_threads(1)  # tiny tensors: no pool wake-ups in the numbers
    from dnnctl.backends import replay

    found: dict[str, Any] = {"torch": torch.__version__, "clock": a.clock,
                             "replay": replay.enabled()}
    # the replay path (and the C++ BatchNorm node on it) is on with DNNCTL_REPLAY=1
    print(f"replay path: {'on' if replay.enabled() else 'off'} (DNNCTL_REPLAY)\n")
    with stub_gpu.installed():
        if "ops" in parts:
            found["ops"] = ops(a.reps, a.iters, a.depth)
            print("## host us per op (stub kernels, CPU)\n\n" + _table(found["ops"]) + "\n")
        if "step" in parts:
            found["step"] = step(a.reps, a.step_iters, a.base)
            print(f"## ResNet-50 step, base width {a.base}, batch 2, 64x64 (stub kernels, "
                  "CPU)\n\n" + _table(found["step"], "{:.3f}") + "\n")
        if "floor" in parts:
            found["floor"] = floor(a.reps, a.step_iters, a.base)
            print("## the step with a bare autograd Function for each fused BatchNorm\n\n"
                  + _table(found["floor"], "{:.3f}") + "\n")
        if "paths" in parts:
            found["paths"] = paths(a.base)
            print("## where a patched step's calls went\n\n" + json.dumps(found["paths"])
                  + "\n")
        if "profile" in parts:
            found["profile"] = profile(a.profile_steps, a.base, a.top)
            print("## cProfile of the patched step, per step\n\n"
                  + _table(found["profile"]) + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
