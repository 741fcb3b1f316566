"""A whole training step, patched with dnnctl vs eager torch, from the same seed and data.

Models: ResNet-50 (batch 64, 224x224, fp16 autocast, channels_last, SGD momentum 0.9,
cross-entropy on a fixed batch) and a ViT-B/16 block stack (4 blocks, batch 32, 197 tokens,
bf16 autocast, AdamW, MSE to a fixed target). A step is forward + backward + optimizer
step. Each way starts from the same weights and data: ``eager`` (plain torch), and
``dnnctl-<mode>`` for each backward mode (``dnnctl.torch.patch(model, plan,
backward=mode)``: ``plan`` runs dnnctl's backward kernels for the backward problems the
plan has, ``dnnctl`` wherever dnnctl takes them, ``torch`` never). Reported: median ms per
step (CUDA events; wall clock on CPU), speed-up over eager, how many backward calls ran on
dnnctl vs torch, and correctness against float64: the first step's gradients of every way
are compared with the model's in float64 (no autocast, same weights and batch);
``grad_err`` is ||g - g64|| / ||g64|| over all parameters. A patched way PASSes when its
error is at most ``--grad-factor`` x eager's (what low precision costs torch itself) or
below 1e-3, both at the start and again after the ``--steps`` steps (``grad_err_late``:
each way's gradient at the weights its steps reached vs float64 at those weights, which
catches state that goes stale as the weights change). The loss after ``--steps`` steps is reported beside eager's and float32 eager's:
on a fixed batch the loss path of a deep net is chaotic (float32 and autocast eager part
within a few steps), so it is shown, not judged.

    PYTHONPATH=. python3 benchmarks/bench_train.py [--quick] [--models resnet50,vit]
        [--backward plan,dnnctl] [--plan PLAN.yaml] [--record-workload DIR] [--graph]
        [--out F.json]
    PYTHONPATH=. python3 benchmarks/bench_train.py --device cpu --tiny   # smoke test

``--graph`` also times every way with its whole step captured as one CUDA graph and
replayed (``graph_ms``; torch's whole-network capture recipe, see ``capture``): the host's
per-op cost leaves the step, so ``graph_speedup`` (both captured) compares GPU work, and
``graph_vs_eager`` is the captured patched step against eager as it usually runs.

The first patched run of a model compiles its dnnctl kernels (NVRTC, cached on disk for
later runs), which the loss steps absorb before timing starts. Without ``--plan`` (and no
active plan) the ``plan`` way runs every backward in torch (there is nothing planned).

Tune for training: ``--record-workload wl/`` writes ``wl/<model>-train.workload.yaml`` (the
forward and backward problems of one autocast training step); ``dnnctl tune
wl/<model>-train.workload.yaml -o plan.yaml``; then ``--plan plan.yaml``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

TITLE = "Training step: dnnctl patch vs eager, median ms per step"
MODELS = ("resnet50", "vit")
GRAD_FACTOR = 2.0  # a patched way's gradient error vs float64, at most this x eager's
GRAD_FLOOR = 1e-3  # ... or below this


@dataclass
class Config:
    """One model's training setup."""

    name: str
    build: Callable[[], nn.Module]
    data: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    amp: torch.dtype | None
    channels_last: bool


def _tiny_resnet(classes: int) -> nn.Module:
    import models

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), models.Bottleneck(16, 8, 1),
                         models.Bottleneck(32, 8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, classes))


def _vit_stack(blocks: int, dim: int, heads: int, mlp: int) -> nn.Module:
    import models

    torch.manual_seed(0)
    return nn.Sequential(*(models.ViTBlock(dim, heads, mlp) for _ in range(blocks)),
                         nn.LayerNorm(dim, eps=1e-6))


def configs(tiny: bool, device: str) -> dict[str, Config]:
    """The two models, full size or a tiny CPU-sized version of each."""
    import models

    low = torch.bfloat16 if device == "cpu" else torch.float16
    if tiny:
        batch, image, classes, nb, dim, heads, mlp, tokens, vb = 2, 32, 10, 2, 64, 4, 128, 17, 2
    else:
        batch, image, classes, nb, dim, heads, mlp, tokens, vb = 64, 224, 1000, 4, 768, 12, \
            3072, 197, 32

    def resnet() -> nn.Module:
        if tiny:
            return _tiny_resnet(classes)
        torch.manual_seed(0)
        return models.ResNet50(classes)

    def resnet_data(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, 3, image, image, generator=g)
        return x, torch.randint(0, classes, (batch,), generator=g)

    def vit_data(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(vb, tokens, dim, generator=g),
                torch.randn(vb, tokens, dim, generator=g))

    return {
        "resnet50": Config("resnet50-tiny" if tiny else f"resnet50-b{batch}", resnet,
                           resnet_data, F.cross_entropy,
                           lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), low, True),
        "vit": Config(f"vit-{nb}blocks-tiny" if tiny else f"vit-b16-{nb}blocks-b{vb}",
                      lambda: _vit_stack(nb, dim, heads, mlp), vit_data, F.mse_loss,
                      lambda p: torch.optim.AdamW(p, lr=1e-4), torch.bfloat16, False),
    }


class Trainer:
    """A model, its optimizer and a fixed batch; ``step()`` is one training step."""

    def __init__(self, cfg: Config, model: nn.Module, device: str, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        x, y = cfg.data(g)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.model = model.to(device).train()
        if cfg.channels_last:
            self.model = self.model.to(memory_format=fmt)
            x = x.contiguous(memory_format=fmt)
        self.x, self.y = x.to(device), y.to(device)
        self.cfg, self.device = cfg, device
        self.opt = cfg.optimizer(self.model.parameters())

    def autocast(self, cache: bool = True) -> Any:
        return torch.autocast(self.device, dtype=self.cfg.amp, enabled=self.cfg.amp is not None,
                              cache_enabled=cache)

    def step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.cfg.loss(self.model(self.x).float(), self.y)
        loss.backward()
        self.opt.step()
        return loss.detach()


def capture(trainer: Trainer, warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The whole step (forward, backward, optimizer step) as one CUDA graph, torch's
    whole-network recipe: a fresh optimizer made capturable (Adam's step count on the
    device), warm-up steps on a side stream, gradients set to None before capture (the
    graph's backward then writes them), autocast's weight cache off inside the graph.
    Returns the graph and its loss tensor (refreshed by every replay)."""
    trainer.opt = trainer.cfg.optimizer(trainer.model.parameters())
    for group in trainer.opt.param_groups:
        if "capturable" in group:
            group["capturable"] = True
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            trainer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    trainer.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with trainer.autocast(cache=False):
            loss = trainer.cfg.loss(trainer.model(trainer.x).float(), trainer.y)
        loss.backward()
        trainer.opt.step()
    return graph, loss


def graph_ms(trainer: Trainer, warmup: int, iters: int) -> float:
    """Median ms per step of the captured step's replays (CUDA events)."""
    graph, _ = capture(trainer)
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def reference(cfg: Config, base: nn.Module, device: str) -> Trainer:
    """The model in float64, no autocast, same weights and batch: the correctness yardstick."""
    tr = Trainer(dataclasses.replace(cfg, amp=None), copy.deepcopy(base).double(), device)
    tr.x = tr.x.double()
    if tr.y.is_floating_point():
        tr.y = tr.y.double()
    return tr


def first_grads(trainer: Trainer, losses: list[float] | None = None
                ) -> dict[str, torch.Tensor]:
    """The parameters' gradients of one forward + backward (no optimizer step), float64;
    the loss is appended to ``losses`` when given."""
    trainer.opt.zero_grad(set_to_none=True)
    with trainer.autocast():
        out = trainer.model(trainer.x)
        loss = trainer.cfg.loss(out if out.dtype == torch.float64 else out.float(), trainer.y)
    loss.backward()
    if losses is not None:
        losses.append(loss.item())
    grads = {n: p.grad.detach().double().clone() for n, p in trainer.model.named_parameters()
             if p.grad is not None}
    trainer.opt.zero_grad(set_to_none=True)
    return grads


def grad_error(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """||g - g_ref|| / ||g_ref|| over all parameters (a missing gradient counts as zero)."""
    num = sum(float((grads.get(n, torch.zeros_like(r)) - r).pow(2).sum()) for n, r in ref.items())
    den = sum(float(r.pow(2).sum()) for r in ref.values())
    return math.sqrt(num / max(den, 1e-300))


def step_ms(trainer: Trainer, warmup: int, iters: int) -> float:
    """Median ms per training step (CUDA events on the GPU, wall clock on the CPU)."""
    cuda = trainer.device == "cuda"
    for _ in range(warmup):
        trainer.step()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            trainer.step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            trainer.step()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _way(cfg: Config, base: nn.Module, device: str, way: str, plan: Any, steps: int,
         warmup: int, iters: int, ref: dict[str, torch.Tensor] | None,
         graph: bool = False) -> dict[str, Any]:
    import dnnctl.torch as dt
    from dnnctl.torch import grad_plan

    if way == "eager-fp32":  # the loss path without autocast (TF32 off), for scale
        trainer = Trainer(dataclasses.replace(cfg, amp=None), copy.deepcopy(base), device)
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            loss = [float(trainer.step()) for _ in range(steps)][-1]
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        return {"model": cfg.name, "way": way, "loss": loss}
    trainer = Trainer(cfg, copy.deepcopy(base), device)
    row: dict[str, Any] = {"model": cfg.name, "way": way}
    report = None
    if way != "eager":
        report = dt.patch(trainer.model, plan, backward=backward_mode(way.split("-", 1)[1]))
        row["covered"] = len(report.covered)
    grad_plan.BACKWARD_PATHS.clear()
    fallbacks = dict(dt.FALLBACKS)
    if ref is not None:
        row["grad_err"] = grad_error(first_grads(trainer), ref)
    losses = [float(trainer.step()) for _ in range(steps)]
    if ref is not None:  # again where the steps led: a stale cache would show here
        here = cfg.build()
        here.load_state_dict(trainer.model.state_dict())
        row["grad_err_late"] = grad_error(first_grads(trainer),
                                          first_grads(reference(cfg, here, device)))
    row["loss0"], row["loss"] = losses[0], losses[-1]
    if way != "eager":
        paths = grad_plan.paths_summary()
        row["bwd_dnnctl"] = sum(v["dnnctl"] for v in paths.values())
        row["bwd_torch"] = sum(v["torch"] for v in paths.values())
        row["backward_paths"] = paths
        row["fallbacks"] = {f"{op}: {why}": n - fallbacks.get((op, why), 0)
                            for (op, why), n in dt.FALLBACKS.items()
                            if n > fallbacks.get((op, why), 0)}
    row["ms"] = step_ms(trainer, warmup, iters)
    if graph:
        row["graph_ms"] = graph_ms(trainer, warmup, iters)
    return row


def backward_mode(spec: str) -> str | dict[str, str]:
    """``mode`` or ``mode+op/pass=mode+...`` (e.g. ``dnnctl+conv2d/wgrad=torch``) as the
    ``backward`` argument of dnnctl.torch.patch."""
    base, *rest = spec.split("+")
    if not rest:
        return base
    out = {"*": base}
    for item in rest:
        sel, _, mode = item.partition("=")
        out[sel] = mode
    return out


def run_model(cfg: Config, device: str, ways: list[str], plan: Any, steps: int, warmup: int,
              iters: int, factor: float, graph: bool = False) -> list[dict[str, Any]]:
    """Rows of one model: eager first, then each patched way, each from the same start, and
    float32 eager's loss (no timing) last."""
    base = cfg.build()
    ref = first_grads(reference(cfg, base, device))
    rows = []
    for way in ["eager", *ways, "eager-fp32"]:
        try:
            rows.append(_way(cfg, base, device, way, plan, steps, warmup, iters, ref, graph))
        except Exception as exc:  # one failing way must not hide the others
            rows.append({"model": cfg.name, "way": way,
                         "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    eager = rows[0]
    for r in rows[1:-1]:
        if "error" in r or "error" in eager:
            r["check"] = "FAIL"
            continue
        r["speedup"] = eager["ms"] / r["ms"]
        if "graph_ms" in r:  # both captured; and the captured step against eager as it runs
            r["graph_speedup"] = eager["graph_ms"] / r["graph_ms"]
            r["graph_vs_eager"] = eager["ms"] / r["graph_ms"]
        r["loss_rel_diff"] = abs(r["loss"] - eager["loss"]) / max(abs(eager["loss"]), 1e-12)
        r["grad_vs_eager"] = r["grad_err"] / max(eager["grad_err"], 1e-300)
        ok = all(r[k] <= max(factor * eager[k], GRAD_FLOOR)
                 for k in ("grad_err", "grad_err_late"))
        r["check"] = "PASS" if ok else "FAIL"
    return rows


def record_workload(cfg: Config, device: str, plan: Any, out_dir: str) -> str:
    """Write the forward + backward problems of one autocast training step."""
    import dnnctl.torch as dt

    trainer = Trainer(cfg, cfg.build(), device)
    with trainer.autocast():
        wl = dt.record(trainer.model, (trainer.x,), train=True, plan=plan,
                       name=f"{cfg.name}-train")
    path = Path(out_dir) / f"{cfg.name}-train.workload.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    wl.save(str(path))
    return str(path)


def _table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("model", "way", "ms", "speedup", "graph_ms", "graph_speedup", "graph_vs_eager",
            "grad_err", "grad_err_late", "check", "loss", "bwd_dnnctl", "bwd_torch", "error")
    return [{k: r[k] for k in keep if k in r} for r in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="resnet50,vit")
    p.add_argument("--backward", default="plan,dnnctl",
                   help="patched ways, by backward mode (plan, dnnctl, torch), each "
                        "optionally with per-op overrides: dnnctl+conv2d/wgrad=torch")
    p.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="leave torch.backends.cudnn.benchmark off (default: on)")
    p.add_argument("--plan", help="a tuned plan (dnnctl.load_plan) for the patched ways")
    p.add_argument("--record-workload", metavar="DIR",
                   help="write each model's training workload to DIR and stop")
    p.add_argument("--steps", type=int, default=20, help="steps before the loss is reported")
    p.add_argument("--iters", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    p.add_argument("--quick", action="store_true", help="fewer timed steps (~2 min)")
    p.add_argument("--grad-factor", type=float, default=GRAD_FACTOR,
                   help="PASS: gradient error vs float64 at most this x eager's")
    p.add_argument("--graph", action="store_true",
                   help="also time each way with its whole step captured as a CUDA graph")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test)")
    p.add_argument("--out", help="write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import _torch_bench as tb

    import dnnctl

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_train: no CUDA device (use --device cpu --tiny for a smoke test)")
        return 2
    names = [m for m in args.models.split(",") if m]
    ways = [f"dnnctl-{m}" for m in args.backward.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    for w in ways:
        mode = backward_mode(w.split("-", 1)[1])
        if any(m not in ("plan", "dnnctl", "torch") for m in (
                [mode] if isinstance(mode, str) else mode.values())):
            unknown.append(w)
    if unknown:
        print(f"bench_train: unknown models / backward modes: {', '.join(unknown)}")
        return 2
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    if args.device == "cuda":
        from dnnctl.backends import replay

        print("replay path:", replay.describe())  # loaded (built on first use) first
    plan = dnnctl.load_plan(args.plan) if args.plan else None
    cfgs = configs(args.tiny, args.device)
    if args.record_workload:
        for name in names:
            path = record_workload(cfgs[name], args.device, plan, args.record_workload)
            print(f"wrote {path}\n  then: dnnctl tune {path} -o plan.yaml")
        return 0
    iters, warmup = (8, 2) if args.quick else (args.iters, args.warmup)
    if args.tiny:
        iters, warmup = min(iters, 2), 0
    rows: list[dict[str, Any]] = []
    for name in names:
        rows += run_model(cfgs[name], args.device, ways, plan, args.steps, warmup, iters,
                          args.grad_factor, args.graph and args.device == "cuda")
    extra = {"device": args.device, "steps": args.steps, "timed_steps": iters,
             "plan": args.plan, "grad_factor": args.grad_factor,
             "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if args.out:
        import json

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"title": TITLE, "meta": {
            **tb.environment(), **extra}, "rows": rows}, indent=1, default=str))
    tb.finish(TITLE, _table(rows), None, extra)
    for r in rows:
        for what in ("backward_paths", "fallbacks"):
            if r.get(what):
                print(f"{r['model']} {r['way']} {what}: {r[what]}")
    failed = [r for r in rows if r.get("check") == "FAIL" or "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
