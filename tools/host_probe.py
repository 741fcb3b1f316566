"""Host time of a model's forward, module by module, eager against patched, with the GPU held
behind a long sleep (so no call waits for the device and every number is host time only).

For each model and way (eager, patched) it prints:

- host ms per forward (the forward enqueued behind ``torch.cuda._sleep``);
- per module class: calls per forward, host us per call inside the model (forward hooks),
  and the same module called alone in a loop with the input it got in the model;
- for the patched way, the time spent in the C calls under dnnctl (kernel launches, cuBLAS,
  torch's cuDNN routes), so the rest is Python.

    PYTHONPATH=. python3 tools/host_probe.py --models vit_b16-b32,resnet50-b32 [--plan P]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models  # noqa: E402

SLEEP = 400_000_000  # cycles: ~0.2 s, longer than any host-side forward here


def held(fn: Any, n: int, reps: int = 7, sleep: int = SLEEP, warm: int = 0) -> float:
    """Median host us per fn() with the GPU asleep behind them (``warm`` calls first)."""
    import torch

    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


class Timers:
    """Per-module host time from forward pre / post hooks (leaf modules only)."""

    def __init__(self, root: Any) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.first: dict[int, tuple[Any, tuple, str]] = {}  # id -> (module, args, label)
        self.stack: list[int] = []
        self.top = 0.0  # us in modules called from no hooked module (no double count)
        self.handles = []
        self.on = False
        for m in root.modules():
            if any(True for _ in m.children()) and type(m).__name__ not in (
                    "FusedConv", "FusedLinear", "Routed"):
                continue
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _label(self, m: Any) -> str:
        name = type(m).__name__
        act = getattr(m, "act", None)
        if name == "FusedConv":
            parts = ["conv", "bn" if m._modules.get("bn") is not None else ""]
            return "FusedConv(" + "+".join(p for p in parts if p) + f"+{act})"
        return name

    def _pre(self, m: Any, args: Any) -> None:
        if self.on:
            if id(m) not in self.first:
                self.first[id(m)] = (m, args, self._label(m))
            self.stack.append(time.perf_counter_ns())

    def _post(self, m: Any, args: Any, out: Any) -> None:
        if self.on and self.stack:
            dt = time.perf_counter_ns() - self.stack.pop()
            if not self.stack:
                self.top += dt / 1e3
            label = self._label(m)
            self.total[label] += dt / 1e3
            self.calls[label] += 1

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def c_timers() -> tuple[dict[str, list[float]], Any]:
    """Wrap the C calls under dnnctl (launch, cuBLAS through call_ints, torch's cuDNN
    convolution routes) with timers; returns (name -> [us, calls], undo)."""
    import torch

    from dnnctl.backends import cuda

    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    undo = []

    def wrap(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                slot = acc[label]
                slot[0] += (time.perf_counter_ns() - t0) / 1e3
                slot[1] += 1
        setattr(owner, attr, timed)
        undo.append((owner, attr, fn))

    nat = cuda.native()
    if nat is not None:
        for attr in ("launch", "call_ints"):
            wrap(nat, attr, f"native.{attr}")
    for attr in ("cudnn_convolution_relu", "cudnn_convolution_add_relu", "convolution",
                 "cudnn_convolution"):
        wrap(torch, attr, f"torch.{attr}")

    def restore() -> None:
        for owner, attr, fn in undo:
            setattr(owner, attr, fn)
    return acc, restore


def probe(name: str, plan: Any, n_fwd: int, loop: int) -> None:
    import torch

    import dnnctl.torch as dt

    model, inputs = models.build(name)
    with torch.inference_mode():
        for way in ("eager", "patched"):
            if way == "patched":
                report = dt.patch(model, plan)
                print(f"\n{name}: patched {len(report.covered)} modules, "
                      f"{len(report.fusions)} fusions")
            fn = lambda: model(*inputs)  # noqa: E731
            for _ in range(5):
                fn()
            fwd = held(fn, n_fwd)
            root = model
            if way == "patched" and dt.is_patched(model):
                traced = model.__dict__.get("forward")
                root = getattr(traced, "gm", model)
            timers = Timers(root)
            fn()
            timers.on = True
            acc, restore = (c_timers() if way == "patched" else ({}, lambda: None))
            reps = 5
            torch.cuda.synchronize()
            for _ in range(reps):
                torch.cuda._sleep(SLEEP)
                for _ in range(n_fwd):
                    fn()
                torch.cuda.synchronize()
            restore()
            timers.on = False
            nf = reps * n_fwd
            # each module alone, in a loop, with the input it got in the model
            alone: dict[str, list[float]] = defaultdict(list)
            for m, args, label in timers.first.values():
                us = held(lambda m=m, a=args: m(*a), loop, reps=3, sleep=30_000_000)
                alone[label].append(us)
            timers.remove()
            hooked = timers.top / nf
            print(f"\n### {name} {way}: host {fwd / 1e3:.2f} ms per forward "
                  f"(hooked leaf modules {hooked / 1e3:.2f} ms of it, with hooks)")
            print("| module | calls/fwd | in model us/call | alone us/call |")
            print("|---|---:|---:|---:|")
            for label in sorted(timers.total, key=lambda k: -timers.total[k]):
                c = timers.calls[label] / nf
                per = timers.total[label] / timers.calls[label]
                a = statistics.median(alone[label]) if alone[label] else float("nan")
                print(f"| {label} | {c:.0f} | {per:.1f} | {a:.1f} |")
            if acc:
                print("\n| C call (patched) | calls/fwd | us/call | us/fwd |")
                print("|---|---:|---:|---:|")
                for k, (us, c) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
                    print(f"| {k} | {c / nf:.0f} | {us / c:.1f} | {us / nf:.0f} |")
        dt.unpatch(model)
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="vit_b16-b32,resnet50-b32,llama7b-decode-b8-kv2048")
    ap.add_argument("--plan")
    ap.add_argument("--fwd", type=int, default=2, help="forwards per timed sample")
    ap.add_argument("--loop", type=int, default=40, help="calls per sample of a module alone")
    args = ap.parse_args()
    import dnnctl

    plan = dnnctl.load_plan(args.plan) if args.plan else None
    for name in args.models.split(","):
        probe(name, plan, args.fwd, args.loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
