"""Pooling: max_pool2d, avg_pool2d (op ``pool2d``) and global_avg_pool2d.

Importing this package registers the ops and their variants; the public functions below
take NCHW or NHWC 4-D tensors and dispatch through the plan.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Field
from dnnctl.ops.dispatch import Prepared, SiteCache, bind, problem_of, run, signature
from dnnctl.ops.pool import gap, pool2d, tiled  # noqa: F401  (registration)
from dnnctl.ops.registry import get_op

__all__ = ["avg_pool2d", "global_avg_pool2d", "max_pool2d"]

_PAIR = Field("ints", length=2, minimum=0)


def _nchw_dims(x: Any, layout: str, op: str) -> tuple[int, int, int, int]:
    if len(x.shape) != 4 or 0 in x.shape:
        raise ShapeError(f"{op}: x has shape {tuple(x.shape)}, expected a non-empty 4-D "
                         f"{layout} tensor")
    n, a, b, d = x.shape
    return (n, a, b, d) if layout == "NCHW" else (n, d, a, b)


_FAST = SiteCache()


def _pool(mode: str, x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any,
          ceil_mode: bool, count_include_pad: bool, layout: str, out: Any, plan: Any) -> Any:
    sig = (mode, kernel, stride, padding, dilation, ceil_mode, count_include_pad, layout)
    if out is None:  # a signature seen before: no validation
        try:
            prep = _FAST[(signature(x), *sig)]
        except (AttributeError, KeyError, TypeError):
            pass
        else:
            return prep.run({"x": x}, plan)["y"]
    op = f"{mode}_pool2d"
    bound = bind(x, out)
    xa, oa = bound.arrays
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        y = _pool(mode, xa, kernel, stride, padding, dilation, ceil_mode, count_include_pad,
                  layout, oa, plan)
        return out if out is not None else bound.wrap(y)
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    layout = mc.check_layout(layout)
    n, c, h, w = _nchw_dims(xa, layout, op)
    key = {"n": n, "c": c, "h": h, "w": w, "mode": mode,
           "kernel": _PAIR.normalize(op, "kernel", kernel),
           "stride": None if stride is None else _PAIR.normalize(op, "stride", stride),
           "pad": _PAIR.normalize(op, "padding", padding),
           "dilation": _PAIR.normalize(op, "dilation", dilation),
           "ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad),
           "dtype": dtype, "layout": layout}
    if mode == "max":
        key["count_include_pad"] = True
    if oa is None:
        prep = Prepared("pool2d", key, bound, {})
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put((signature(xa), *sig), prep)
        return prep.run({"x": xa}, plan)["y"]
    pool = get_op("pool2d")
    mc.check_out(oa, pool.output_specs(problem_of(pool, key))["y"].shape, dtype)
    run("pool2d", key, bound, ("x",), {}, plan=plan, out={"y": oa})
    return out


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


def global_avg_pool2d(x: Any, layout: str = "NCHW", plan: Any = None, *,
                      out: Any = None) -> Any:
    """Mean over H x W: NCHW -> (N, C, 1, 1), NHWC -> (N, 1, 1, C)."""
    if out is None:  # a signature seen before: no validation
        try:
            prep = _FAST[(signature(x), "gap", layout)]
        except (AttributeError, KeyError, TypeError):
            pass
        else:
            return prep.run({"x": x}, plan)["y"]
    bound = bind(x, out)
    xa, oa = bound.arrays
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        y = global_avg_pool2d(xa, layout, plan, out=oa)
        return out if out is not None else bound.wrap(y)
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    given_layout, layout = layout, mc.check_layout(layout)
    n, c, h, w = _nchw_dims(xa, layout, "global_avg_pool2d")
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout}
    if oa is None:
        prep = Prepared("global_avg_pool2d", key, bound, {})
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put((signature(xa), "gap", given_layout), prep)
        return prep.run({"x": xa}, plan)["y"]
    mc.check_out(oa, (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c), dtype)
    run("global_avg_pool2d", key, bound, ("x",), {}, plan=plan, out={"y": oa})
    return out
