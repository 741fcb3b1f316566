"""Where a patched model's forward time goes, next to eager: wall ms per forward, GPU-busy ms
(sum of kernel times), GPU time hidden behind the sleep (kernel-only ms), and the top kernels
and top host ops of each way (torch profiler).

    PYTHONPATH=. python3 tools/e2e_profile.py --models resnet50-b32,vit_b16-b32 [--plan P]
    PYTHONPATH=. python3 tools/e2e_profile.py --models resnet50-b1 --compile  # compiled ways
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _torch_bench as tb  # noqa: E402
import models  # noqa: E402


def _wall_ms(fn, n: int = 10) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def _gpu_only_ms(fn, n: int = 5) -> float:
    """Forward time with the host running ahead (a long sleep queued first): GPU time only."""
    return tb.kernel_us(fn, samples=n, sleep_cycles=200_000_000) / 1e3


def _profile(fn, label: str, top: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    iters = 3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    ev = prof.key_averages()
    gpu = sorted(ev, key=lambda e: -e.self_device_time_total)
    total_gpu = sum(e.self_device_time_total for e in ev) / iters / 1e3
    print(f"\n### {label}: GPU kernel time {total_gpu:.2f} ms per forward")
    print("| GPU us/fwd | calls/fwd | kernel |\n|---:|---:|---|")
    for e in gpu[:top]:
        if e.self_device_time_total <= 0:
            break
        print(f"| {e.self_device_time_total / iters:.1f} | {e.count / iters:.1f} | "
              f"{e.key[:90]} |")
    cpu = sorted(ev, key=lambda e: -e.self_cpu_time_total)
    print("\n| host self us/fwd | calls/fwd | op |\n|---:|---:|---|")
    for e in cpu[:top]:
        print(f"| {e.self_cpu_time_total / iters:.1f} | {e.count / iters:.1f} | {e.key[:90]} |")


def _conv_route(route: str) -> None:
    """Force the un-tuned conv2d forward route: cuDNN fused conv+bias+ReLU where it applies
    and cuDNN + dnnctl's epilogue elsewhere (fused), cuDNN + epilogue everywhere (unfused),
    dnnctl's own kernels (own)."""
    if route == "default":
        return
    from dnnctl.ops.base import Choice
    from dnnctl.ops.conv2d import op

    own = op.own_choice

    def choice(self, problem, backend, device):  # noqa: ANN001, ANN202
        if backend == "numpy" or problem.get("pass", "forward") != "forward" or route == "own":
            return own(problem, backend, device)
        fused = (route == "fused" and problem["activation"] == "relu"
                 and not problem["residual"])
        return Choice.of("torch_cudnn", {"fuse": int(fused)})

    op.Conv2d.default_choice = choice
    print(f"conv route: {route}")


def _cprofile(fn, label: str, top: int, n: int = 20, per: str = "fwd") -> None:
    """Own and cumulative time per call of ``fn`` of the Python functions under it
    (cProfile inflates each Python call about equally: read the shares)."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    print(f"\n### {label} cProfile: {st.total_tt / n * 1e6:.1f} us per {per} (inflated)")
    print(f"| own us/{per} | cum us/{per} | calls/{per} | function |\n|---:|---:|---:|---|")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, name), (_, nc, tt, ct, _) in rows:
        where = f"{Path(file).name}:{line}" if line else file
        print(f"| {tt / n * 1e6:.1f} | {ct / n * 1e6:.1f} | {nc / n:.1f} | {name} ({where}) |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50-b32,vit_b16-b32")
    ap.add_argument("--plan")
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--conv", default="default",
                    help="un-tuned conv route: default | fused | unfused | own")
    ap.add_argument("--cprofile", action="store_true",
                    help="also cProfile the patched forward (Python functions' own time)")
    ap.add_argument("--no-torch-profile", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="profile both ways under torch.compile (default mode: no CUDA "
                         "graphs, so the profiler sees each kernel), to compare the GPU "
                         "work of the compiled eager model and of the compiled patched one")
    args = ap.parse_args()
    _conv_route(args.conv)
    import torch

    import dnnctl
    import dnnctl.torch as dt

    plan = dnnctl.load_plan(args.plan) if args.plan else None
    for name in args.models.split(","):
        model, inputs = models.build(name)
        with torch.inference_mode():
            for way in ("eager", "dnnctl"):
                if way == "dnnctl":
                    report = dt.patch(model, plan)
                    print(f"\n## {name} patched: {len(report.covered)} modules, "
                          f"{len(report.fusions)} fusions")
                target = model
                if args.compile:
                    torch._dynamo.reset()
                    target = torch.compile(model)
                    way += "+compile"
                fn = lambda m=target, i=inputs: m(*i)  # noqa: E731
                fn()  # (compiles)
                wall, gpu = _wall_ms(fn), _gpu_only_ms(fn)
                print(f"\n## {name} {way}: wall {wall:.2f} ms/fwd, GPU-only {gpu:.2f} ms/fwd")
                if not args.no_torch_profile:
                    _profile(fn, f"{name} {way}", args.top)
                if args.cprofile and way.startswith("dnnctl"):
                    _cprofile(fn, f"{name} {way}", args.top)
            dt.unpatch(model)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
