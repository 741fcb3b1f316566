"""Pooling: max_pool2d, avg_pool2d (op ``pool2d``) and global_avg_pool2d.

Importing this package registers the ops and their variants; the public functions below
take NCHW or NHWC 4-D tensors and dispatch through the plan.
"""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Field
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs
from dnnctl.ops.pool import gap, pool2d, tiled  # noqa: F401  (registration)

__all__ = ["avg_pool2d", "global_avg_pool2d", "max_pool2d"]

_PAIR = Field("ints", length=2, minimum=0)


def _nchw_dims(x: Any, layout: str, op: str) -> tuple[int, int, int, int]:
    if len(x.shape) != 4 or 0 in x.shape:
        raise ShapeError(f"{op}: x has shape {tuple(x.shape)}, expected a non-empty 4-D "
                         f"{layout} tensor")
    n, a, b, d = x.shape
    return (n, a, b, d) if layout == "NCHW" else (n, d, a, b)


def _parse_pool(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, out = arrays
    mode, kernel, stride, padding, dilation, ceil_mode, count_include_pad, layout = scalars
    op = f"{mode}_pool2d"
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(layout)
    n, c, h, w = _nchw_dims(x, layout, op)
    key = {"n": n, "c": c, "h": h, "w": w, "mode": mode,
           "kernel": _PAIR.normalize(op, "kernel", kernel),
           "stride": None if stride is None else _PAIR.normalize(op, "stride", stride),
           "pad": _PAIR.normalize(op, "padding", padding),
           "dilation": _PAIR.normalize(op, "dilation", dilation),
           "ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad),
           "dtype": dtype, "layout": layout}
    if mode == "max":
        key["count_include_pad"] = True
    return _single_output("pool2d", key, x, out)


def _single_output(op: str, key: dict[str, Any], x: Any, out: Any) -> Parsed:
    """x -> y with an optional ``out=``, the output in the op's spec shape."""
    outputs = spec_outputs(op, key)
    if out is None:
        return Parsed(op, key, (("x", 0, None),), outputs)
    mc.check_out(out, outputs[0][1], key["dtype"])
    return Parsed(op, key, (("x", 0, None),), (), (("y", 1),), result=1)


_POOL = CallSpec("pool2d", _parse_pool)


def _pool(mode: str, x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any,
          ceil_mode: bool, count_include_pad: bool, layout: str, out: Any, plan: Any) -> Any:
    return call(_POOL, (x, out), (mode, kernel, stride, padding, dilation, ceil_mode,
                                  count_include_pad, layout), plan)


def max_pool2d(x: Any, kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, layout: str = "NCHW", plan: Any = None, *,
               out: Any = None) -> Any:
    """2-D max pooling (PyTorch semantics: pad <= kernel // 2, NaN propagates)."""
    return _pool("max", x, kernel, stride, padding, dilation, ceil_mode, True, layout, out,
                 plan)


def avg_pool2d(x: Any, kernel: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, layout: str = "NCHW",
               plan: Any = None, *, out: Any = None) -> Any:
    """2-D average pooling (PyTorch semantics for the divisor)."""
    return _pool("avg", x, kernel, stride, padding, 1, ceil_mode, count_include_pad, layout,
                 out, plan)


def _parse_gap(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, out = arrays
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(scalars[0])
    n, c, h, w = _nchw_dims(x, layout, "global_avg_pool2d")
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout}
    return _single_output("global_avg_pool2d", key, x, out)


_GAP = CallSpec("global_avg_pool2d", _parse_gap)


def global_avg_pool2d(x: Any, layout: str = "NCHW", plan: Any = None, *,
                      out: Any = None) -> Any:
    """Mean over H x W: NCHW -> (N, C, 1, 1), NHWC -> (N, 1, 1, C)."""
    return call(_GAP, (x, out), (layout,), plan)
