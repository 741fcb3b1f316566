"""Per-call overhead of dnnctl from torch CUDA tensors (and CuPy arrays) against torch.

Five probe ops, fp16: softmax 64x128, layer_norm 64x768, matmul 64^3, conv2d 8x64x28x28
NHWC 3x3 (64 filters, pad 1) and relu 64x768. Each runs as: the torch op; ``dnnctl.ops.*``
on torch tensors unplanned and planned; ``torch.ops.dnnctl.*`` (the registered op, through
the dispatcher); the direct path a patched module takes under no_grad; ``dnnctl.ops.*`` on
CuPy arrays unplanned and planned. "wall us": host wall time per call (N back-to-back calls
between synchronizations, median of 7); "kernel us": CUDA-event time of one call with the
GPU kept busy (device time only); "+us vs torch": wall minus torch's wall. The planned
rows use ``--plan PATH`` if given, else an in-memory plan of each problem's default choice
(so planned and unplanned run the same kernel and differ only by the lookup).

    PYTHONPATH=. python3 benchmarks/bench_torch_overhead.py [--quick] [--plan P] [--out F]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _torch_bench as tb  # noqa: E402

TITLE = "Per-call overhead from torch tensors: dnnctl vs torch (fp16)"


class _Spy:
    """A plan that plans nothing and remembers the problems it was asked about."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def lookup(self, problem: Any, backend: str, device: Any) -> None:
        if problem not in self.seen:
            self.seen.append(problem)


def cases() -> list[tuple[str, dict[str, Callable[..., Any]]]]:
    """(label, {way: fn(plan) -> None}) per probe op."""
    import torch
    import torch.nn.functional as F

    import dnnctl
    import dnnctl.torch  # noqa: F401  (torch.ops.dnnctl)
    from dnnctl.torch.library import KERNELS

    D, ops = torch.ops.dnnctl, dnnctl.ops
    h = dict(device="cuda", dtype=torch.float16)
    x_sm, x_ln, w_ln, b_ln = (torch.randn(64, 128, **h), torch.randn(64, 768, **h),
                              torch.randn(768, **h), torch.randn(768, **h))
    a, b = torch.randn(64, 64, **h), torch.randn(64, 64, **h)
    x_cv = torch.randn(8, 64, 28, 28, **h).contiguous(memory_format=torch.channels_last)
    w_cv = torch.randn(64, 64, 3, 3, **h).contiguous(memory_format=torch.channels_last)
    x_nhwc, w_nhwc = x_cv.permute(0, 2, 3, 1), w_cv.permute(0, 2, 3, 1)  # contiguous views
    x_re = torch.randn(64, 768, **h)
    return [
        ("softmax 64x128", {
            "torch": lambda p: F.softmax(x_sm, -1),
            "dnnctl.ops": lambda p: ops.softmax(x_sm, plan=p),
            "torch.ops.dnnctl": lambda p: D.softmax(x_sm, -1),
            "patched module path": lambda p: KERNELS["softmax"](x_sm, -1),
            "_cupy": lambda p, c=None: ops.softmax(c[0], plan=p), "_args": (x_sm,)}),
        ("layer_norm 64x768", {
            "torch": lambda p: F.layer_norm(x_ln, (768,), w_ln, b_ln),
            "dnnctl.ops": lambda p: ops.layer_norm(x_ln, w_ln, b_ln, plan=p),
            "torch.ops.dnnctl": lambda p: D.layer_norm(x_ln, w_ln, b_ln, 1e-5),
            "patched module path": lambda p: KERNELS["layer_norm"](x_ln, w_ln, b_ln, 1e-5),
            "_cupy": lambda p, c=None: ops.layer_norm(c[0], c[1], c[2], plan=p),
            "_args": (x_ln, w_ln, b_ln)}),
        ("matmul 64^3", {
            "torch": lambda p: a @ b,
            "dnnctl.ops": lambda p: ops.matmul(a, b, plan=p),
            "torch.ops.dnnctl": lambda p: D.matmul(a, b),
            "patched module path": lambda p: KERNELS["matmul"](a, b),
            "_cupy": lambda p, c=None: ops.matmul(c[0], c[1], plan=p), "_args": (a, b)}),
        ("conv2d 8x64x28x28 NHWC 3x3", {
            "torch": lambda p: F.conv2d(x_cv, w_cv, padding=1),
            "dnnctl.ops": lambda p: ops.conv2d(x_nhwc, w_nhwc, padding=1, layout="NHWC",
                                               plan=p),
            "torch.ops.dnnctl": lambda p: D.conv2d(x_cv, w_cv, None, [1, 1], [1, 1]),
            "patched module path": lambda p: KERNELS["conv2d"](x_cv, w_cv, None, [1, 1],
                                                               [1, 1]),
            "_cupy": lambda p, c=None: ops.conv2d(c[0], c[1], padding=1, layout="NHWC",
                                                  plan=p),
            "_args": (x_nhwc, w_nhwc)}),
        ("relu 64x768", {
            "torch": lambda p: F.relu(x_re),
            "dnnctl.ops": lambda p: ops.relu(x_re, plan=p),
            "torch.ops.dnnctl": lambda p: D.relu(x_re),
            "patched module path": lambda p: KERNELS["relu"](x_re),
            "_cupy": lambda p, c=None: ops.relu(c[0], plan=p), "_args": (x_re,)}),
    ]


def _plan_for(ways: dict[str, Callable[..., Any]], given: Any) -> Any:
    if given is not None:
        return given
    spy = _Spy()
    ways["dnnctl.ops"](spy)
    return tb.default_plan(spy.seen)


def run(quick: bool, plan_path: str | None) -> list[dict[str, Any]]:
    import torch

    import dnnctl

    given = dnnctl.load_plan(plan_path) if plan_path else None
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for label, ways in cases():
            rows += _rows(label, ways, given, quick)
    return rows


def _rows(label: str, ways: dict[str, Any], given: Any, quick: bool) -> list[dict[str, Any]]:
    """One row per way of calling one probe op."""
    n = 500 if quick else 3000
    plan: Any = None
    why = ""
    try:
        plan = _plan_for(ways, given)
    except Exception as exc:  # the planned rows say why
        why = f"{type(exc).__name__}: {exc}"
    cupy_args = _cupy(ways["_args"])
    todo: list[tuple[str, Callable[[], Any]]] = [
        ("torch", lambda: ways["torch"](None)),
        ("dnnctl.ops unplanned", lambda: ways["dnnctl.ops"](None)),
        ("dnnctl.ops planned", lambda: ways["dnnctl.ops"](_need(plan, why))),
        ("torch.ops.dnnctl", lambda: ways["torch.ops.dnnctl"](None)),
        ("patched module path", lambda: ways["patched module path"](None)),
        ("cupy unplanned", lambda: ways["_cupy"](None, _need(cupy_args, "no CuPy"))),
        ("cupy planned", lambda: ways["_cupy"](_need(plan, why), _need(cupy_args, "no CuPy"))),
    ]
    base: dict[str, float] = {}
    rows = []
    for way, fn in todo:
        def measure(fn: Callable[[], Any] = fn, way: str = way) -> dict[str, Any]:
            wall = tb.wall_us(fn, n)
            out: dict[str, Any] = {"wall us": wall, "kernel us": tb.kernel_us(
                fn, 20 if quick else 60)}
            if way == "torch":
                base["wall"] = wall
            elif "wall" in base:
                out["+us vs torch"] = wall - base["wall"]
            return out
        rows.append(tb.safe_row({"op": label, "way": way}, measure))
    return rows


def _need(value: Any, why: str) -> Any:
    if value is None:
        raise RuntimeError(why or "not available")
    return value


def _cupy(tensors: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The same data as CuPy arrays (zero-copy), or None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    return tuple(cupy.from_dlpack(t) for t in tensors)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls per sample")
    ap.add_argument("--plan", help="a tuned plan for the planned rows")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_torch_overhead: needs a CUDA GPU with a CUDA build of torch")
        return 3
    from dnnctl.backends import replay

    state = replay.describe()  # loaded (built on first use) before timing
    print(f"replay path: {state}")
    rows = run(args.quick, args.plan)
    tb.finish(TITLE, rows, args.out, {"plan": args.plan or "defaults (in memory)",
                                      "replay": state})
    return 0


if __name__ == "__main__":
    sys.exit(main())
