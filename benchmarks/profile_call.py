"""Where one dnnctl call's host time goes, from torch CUDA tensors: cProfile of N calls.

For each probe op of bench_torch_overhead.py (softmax, layer_norm, matmul, conv2d, relu,
fp16) and each way (``dnnctl.ops`` unplanned, ``torch.ops.dnnctl``): the wall time per call,
then the functions with the most own time (cProfile inflates every Python call about
equally, so read the shares, not the absolute numbers), and the kernels launched per call.

    PYTHONPATH=. python3 benchmarks/profile_call.py [--calls N] [--top K]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_torch_overhead as bto  # noqa: E402


def _wall(fn, n: int) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(best)[2]


def _launches(fn) -> int:
    """Kernels launched by one call (counted at the launch seam; cuBLAS calls not)."""
    from dnnctl.backends import cuda

    count = [0]
    orig = cuda.Launch.__call__

    def counting(self, args):
        count[0] += 1
        return orig(self, args)

    cuda.Launch.__call__ = counting
    try:
        fn()
    finally:
        cuda.Launch.__call__ = orig
    return count[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("profile_call: needs a CUDA GPU with a CUDA build of torch")
        return 3
    with torch.no_grad():
        for label, ways in bto.cases():
            for way in ("torch", "dnnctl.ops", "torch.ops.dnnctl"):
                def fn(f=ways[way]):
                    return f(None)
                wall = _wall(fn, args.calls)
                n_launch = _launches(fn) if way != "torch" else 0
                print(f"\n### {label} — {way}: {wall:.2f} us/call wall, "
                      f"{n_launch} kernel launches per call")
                if way == "torch":
                    continue
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    fn()
                prof.disable()
                torch.cuda.synchronize()
                st = pstats.Stats(prof)
                total = st.total_tt
                rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
                print(f"profiled: {total / args.calls * 1e6:.2f} us/call")
                print("| own us/call | calls/call | function |\n|---:|---:|---|")
                for (file, line, name), (_, nc, tt, _, _) in rows:
                    where = f"{Path(file).name}:{line}" if line else file
                    print(f"| {tt / args.calls * 1e6:.2f} | {nc / args.calls:.1f} | "
                          f"{name} ({where}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
