"""Where a patched training step departs from eager torch: per module, per gradient, per step.

Runs one model of bench_train three ways from the same weights and batch: the float64
reference (R: the model in float64, no autocast), eager torch (A: autocast as configured) and
patched (P, ``dnnctl.torch.patch(model, backward=MODE)``, the same autocast). A's distance
from R is what low precision costs torch itself; P is judged against it. Prints

- each leaf module's forward output, P vs R and A vs R (max |diff| / max |R|), the modules
  where P departs (more than ``--factor`` x A's error and more than ``--floor``) first;
- each parameter's gradient after one backward (||g - gR|| / ||gR||, P and A);
- the BatchNorm running statistics after the forward;
- the loss of each way for ``--steps`` steps (eager in float32 as well, TF32 off);
- with ``--profile``: the CUDA kernels and host ops of one patched step and one eager step
  (torch.profiler), so the time per step can be read per kernel.

    PYTHONPATH=. python3 benchmarks/diag_train.py [--model resnet50] [--backward torch]
        [--steps 20] [--profile] [--device cpu --tiny]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_train as bt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = a.abs().max().item()
    return (a - b).abs().max().item() / max(scale, 1e-30)


def _norm_rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        return float("nan") if a is not b else 0.0
    a, b = a.detach().double(), b.detach().double()
    return (a - b).norm().item() / max(a.norm().item(), 1e-30)


def _capture(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[Any]]:
    outs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, m in model.named_modules():
        if next(m.children(), None) is not None or not name:
            continue

        def hook(_m: nn.Module, _inp: Any, out: Any, name: str = name) -> None:
            if isinstance(out, torch.Tensor) and name not in outs:
                outs[name] = out.detach().clone()
        hooks.append(m.register_forward_hook(hook))
    return outs, hooks


def one_step(tr: bt.Trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """(module outputs, parameter gradients, loss) of one forward + backward."""
    outs, hooks = _capture(tr.model)
    loss: list[float] = []
    try:
        grads = bt.first_grads(tr, loss)
    finally:
        for h in hooks:
            h.remove()
    return outs, grads, loss[0]


def compare(args: argparse.Namespace) -> None:
    import dnnctl.torch as dt

    cfg = bt.configs(args.tiny, args.device)[args.model]
    base = cfg.build()
    ways = {"R": bt.reference(cfg, base, args.device),
            **{w: bt.Trainer(cfg, copy.deepcopy(base), args.device) for w in "AP"}}
    report = dt.patch(ways["P"].model, None, backward=bt.backward_mode(args.backward))
    print(f"patched: {len(report.covered)} modules on dnnctl, {len(report.skipped)} skipped")
    res = {w: one_step(t) for w, t in ways.items()}
    print("loss after one forward: " + "  ".join(f"{w} {r[2]:.6f}" for w, r in res.items()))
    outs = {w: r[0] for w, r in res.items()}

    def departs(p: float, a: float) -> bool:
        return not p <= max(args.factor * a, args.floor)

    def show(title: str, rows: list[tuple[str, float, float, str]]) -> None:
        bad = [r for r in rows if departs(r[1], r[2])]
        print(f"\n## {title}: {len(bad)} of {len(rows)} depart (P's error > "
              f"{args.factor:g} x A's and > {args.floor:g}); first:")
        for r in bad[:args.top]:
            print(f"    {r[0]:36s} P {r[1]:.2e}  A {r[2]:.2e}  {r[3]}")
        ratio = [r for r in rows if r[2] > 0]
        if ratio:
            worst = sorted(ratio, key=lambda r: -r[1] / r[2])[:args.top // 2]
            print("  worst P / A:")
            for r in worst:
                print(f"    {r[0]:36s} P {r[1]:.2e}  A {r[2]:.2e}  {r[3]}")

    rows = []
    for name, r in outs["R"].items():
        p, a = outs["P"].get(name), outs["A"].get(name)
        if p is None or a is None or p.shape != r.shape:
            rows.append((name, float("inf"), 0.0, "missing or reshaped"))
            continue
        rows.append((name, _rel(r, p), _rel(r, a), f"{tuple(p.shape)} {str(p.dtype)[6:]}"))
    show("forward outputs in call order (max|x - R| / max|R|)", rows)
    grads = {w: r[1] for w, r in res.items()}
    show("gradients after one backward (||g - gR|| / ||gR||)",
         [(n, _norm_rel(g, grads["P"].get(n)), _norm_rel(g, grads["A"].get(n)), "")
          for n, g in grads["R"].items()])
    bufs = {w: dict(t.model.named_buffers()) for w, t in ways.items()}
    show("running statistics after the forward",
         [(n, _norm_rel(b, bufs["P"][n]), _norm_rel(b, bufs["A"][n]), "")
          for n, b in bufs["R"].items() if b.is_floating_point()])


def trajectories(args: argparse.Namespace) -> None:
    import dnnctl.torch as dt

    cfg = bt.configs(args.tiny, args.device)[args.model]
    base = cfg.build()
    ways = {"eager fp32": bt.Trainer(dataclasses.replace(cfg, amp=None), copy.deepcopy(base),
                                     args.device),
            "eager": bt.Trainer(cfg, copy.deepcopy(base), args.device)}
    for mode in args.modes.split(","):
        tr = bt.Trainer(cfg, copy.deepcopy(base), args.device)
        dt.patch(tr.model, None, backward=bt.backward_mode(mode))
        ways[f"dnnctl-{mode}"] = tr
    print(f"\n## loss per step ({args.steps} steps)")
    losses = {w: [float(t.step()) for _ in range(args.steps)] for w, t in ways.items()}
    for w, ls in losses.items():
        print(f"  {w:16s} " + " ".join(f"{v:.3f}" for v in ls))


def profile(args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    import dnnctl.torch as dt

    cfg = bt.configs(args.tiny, args.device)[args.model]
    base = cfg.build()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    for way in ("dnnctl", "eager"):
        tr = bt.Trainer(cfg, copy.deepcopy(base), args.device)
        if way == "dnnctl":
            dt.patch(tr.model, None, backward=bt.backward_mode(args.backward))
        for _ in range(3):
            tr.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        with prof(activities=acts) as p:
            tr.step()
            if args.device == "cuda":
                torch.cuda.synchronize()
        keys = (["self_device_time_total"] if args.device == "cuda" else []) + [
            "cpu_time_total"]
        for key in keys:
            print(f"\n## one {way} step, by {key} (top {args.top * 2})")
            print(p.key_averages().table(sort_by=key, row_limit=args.top * 2,
                                         max_name_column_width=50))


def cprofile(args: argparse.Namespace) -> None:
    """The host side of patched steps, per Python function (cProfile), and who calls the
    costliest builtins."""
    import cProfile
    import pstats

    import dnnctl.torch as dt

    cfg = bt.configs(args.tiny, args.device)[args.model]
    tr = bt.Trainer(cfg, cfg.build(), args.device)
    dt.patch(tr.model, None, backward=bt.backward_mode(args.backward))
    for _ in range(3):
        tr.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        tr.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    print(f"\n## host time of 5 patched steps (backward={args.backward}), by own time")
    st.sort_stats("tottime").print_stats(30)
    print("## by cumulative time")
    st.sort_stats("cumtime").print_stats(40)
    print("## callers of the costliest")
    st.sort_stats("tottime").print_callers(8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", choices=bt.MODELS)
    p.add_argument("--backward", default="torch", help="the patched way's backward mode")
    p.add_argument("--modes", default="torch,dnnctl", help="backward modes of the loss runs")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--factor", type=float, default=3.0, help="departs: > factor x A's error")
    p.add_argument("--floor", type=float, default=1e-3, help="... and > this")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--only", default="compare,steps,profile")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("diag_train: no CUDA device (use --device cpu --tiny)")
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here
    torch.backends.cudnn.allow_tf32 = False
    only = args.only.split(",")
    if "compare" in only:
        compare(args)
    if "steps" in only:
        trajectories(args)
    if "profile" in only and args.profile:
        profile(args)
    if "cprofile" in only:
        cprofile(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
