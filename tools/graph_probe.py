"""What a CUDA graph of a model's forward holds, eager model against the patched one: node
counts by type (kernel, memset, memcpy, ...), kernel counts by name, and the replay time
(median ms, CUDA events) next to the non-graph GPU-only time.

    PYTHONPATH=. python3 tools/graph_probe.py --models resnet50-b1 [--plan P] [--dot DIR]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _torch_bench as tb  # noqa: E402
import models  # noqa: E402


def _nodes(dot: str) -> tuple[collections.Counter, collections.Counter]:
    """Node kinds and kernel names of a cudaGraphDebugDotPrint file (record labels
    ``{KERNEL | {ID | 3 (topoId: 86) | name<<<grid,block,smem>>>} ...``)."""
    kinds: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    for label in re.findall(r'label="\{(.*?)"\]', dot, flags=re.S):
        kind = re.split(r"[\s|]", label.strip(), maxsplit=1)[0]
        kinds[kind] += 1
        if kind == "KERNEL":
            name = re.search(r"topoId: \d+\) \| ([^\\<|}]+)", label)
            kernels[(name.group(1).strip() if name else "?")[:70]] += 1
    return kinds, kernels


def _cudart():  # noqa: ANN202
    import ctypes
    import glob
    import site

    try:
        lib = ctypes.CDLL(None)  # torch loads libcudart with RTLD_GLOBAL
        lib.cudaGraphDebugDotPrint  # noqa: B018
        return lib
    except (AttributeError, OSError):
        pass
    for d in [*site.getsitepackages(), *sys.path]:
        for f in sorted(glob.glob(f"{d}/nvidia/cu*/lib/libcudart.so*")
                        + glob.glob(f"{d}/nvidia/cuda_runtime/lib/libcudart.so*")):
            return ctypes.CDLL(f)
    return ctypes.CDLL("libcudart.so")


def _dot_print(g, path: Path) -> None:  # noqa: ANN001
    """The captured graph (kept by torch) as a dot file, by cudaGraphDebugDotPrint."""
    import ctypes

    raw = g.raw_cuda_graph()
    rc = _cudart().cudaGraphDebugDotPrint(ctypes.c_void_p(int(raw)),
                                          str(path).encode(), ctypes.c_uint(1))
    if rc:
        raise RuntimeError(f"cudaGraphDebugDotPrint failed ({rc})")


def _probe(label: str, fn, dot_dir: Path, top: int) -> None:  # noqa: ANN001
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # an older torch: no kept graph to read
        g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    path = dot_dir / f"{label}.dot"
    _dot_print(g, path)
    kinds, kernels = _nodes(path.read_text())
    replay = tb.events_ms(g.replay, warmup=5, iters=50)
    gpu = tb.kernel_us(fn, samples=5, sleep_cycles=200_000_000) / 1e3
    print(f"\n## {label}: graph replay {replay:.3f} ms, GPU-only (no graph) {gpu:.3f} ms")
    print("nodes: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
    for name, c in kernels.most_common(top):
        print(f"  {c:4d}  {name}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50-b1")
    ap.add_argument("--plan")
    ap.add_argument("--dot", help="keep the graphs' dot files here")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    import torch

    import dnnctl
    import dnnctl.torch as dt

    plan = dnnctl.load_plan(args.plan) if args.plan else None
    dot_dir = Path(args.dot or tempfile.mkdtemp())
    dot_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        model, inputs = models.build(name)
        with torch.inference_mode():
            _probe(f"{name}-eager", lambda m=model, i=inputs: m(*i), dot_dir, args.top)
            dt.patch(model, plan)
            _probe(f"{name}-patched", lambda m=model, i=inputs: m(*i), dot_dir, args.top)
            dt.unpatch(model)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
