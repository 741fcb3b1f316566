"""Public pooling functions of the training path: max pooling with indices and the backward
of max / avg / global-avg pooling (op keys ``indices: true`` and ``pass: backward``)."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Field, dtype_name
from dnnctl.ops.dispatch import bind, problem_of, run
from dnnctl.ops.registry import get_op

__all__ = ["avg_pool2d_backward", "global_avg_pool2d_backward", "max_pool2d_backward",
           "max_pool2d_with_indices"]

_PAIR = Field("ints", length=2, minimum=0)


def _key(op: str, mode: str, shape: tuple[int, ...], dtype: str, kernel: Any, stride: Any,
         padding: Any, dilation: Any, ceil_mode: bool, count_include_pad: bool,
         layout: str) -> dict[str, Any]:
    if len(shape) != 4 or 0 in shape:
        raise ShapeError(f"{op}: expected a non-empty 4-D {layout} tensor, got shape {shape}")
    n, a, b, d = shape
    n, c, h, w = (n, a, b, d) if layout == "NCHW" else (n, d, a, b)
    return {"n": n, "c": c, "h": h, "w": w, "mode": mode,
            "kernel": _PAIR.normalize(op, "kernel", kernel),
            "stride": None if stride is None else _PAIR.normalize(op, "stride", stride),
            "pad": _PAIR.normalize(op, "padding", padding),
            "dilation": _PAIR.normalize(op, "dilation", dilation),
            "ceil_mode": bool(ceil_mode),
            "count_include_pad": bool(count_include_pad) or mode == "max",
            "dtype": dtype, "layout": layout}


def max_pool2d_with_indices(x: Any, kernel: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, layout: str = "NCHW",
                            plan: Any = None) -> tuple[Any, Any]:
    """Max pooling and its argmax: ``(y, indices)``, indices int32 of y's shape holding the
    flat position ih * W + iw within each (n, c) plane (PyTorch's return_indices)."""
    bound = bind(x)
    xa = bound.arrays[0]
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    layout = mc.check_layout(layout)
    key = _key("max_pool2d_with_indices", "max", tuple(xa.shape), dtype, kernel, stride,
               padding, dilation, ceil_mode, True, layout)
    key["indices"] = True
    res = run("pool2d", key, bound, ("x",), {}, plan=plan)
    return bound.wrap(res["y"]), bound.wrap(res["indices"])


def _backward(mode: str, dy: Any, indices: Any, input_shape: Any, kernel: Any, stride: Any,
              padding: Any, dilation: Any, ceil_mode: bool, count_include_pad: bool,
              layout: str, plan: Any) -> Any:
    op = f"{mode}_pool2d_backward"
    bound = bind(dy, indices)
    ga, ia = bound.arrays
    dtype = mc.float_dtype(ga, "dy")
    mc.contiguous(ga, "dy")
    layout = mc.check_layout(layout)
    key = _key(op, mode, tuple(int(s) for s in input_shape), dtype, kernel, stride, padding,
               dilation, ceil_mode, count_include_pad, layout)
    key["pass"] = "backward"
    pool = get_op("pool2d")
    want = pool.input_specs(problem_of(pool, key))["dy"].shape
    if tuple(ga.shape) != tuple(want):
        raise ShapeError(f"{op}: dy has shape {tuple(ga.shape)}, expected {tuple(want)} for "
                         f"input {tuple(input_shape)}")
    if mode == "max":
        if ia is None or tuple(ia.shape) != tuple(want) or dtype_name(ia.dtype) != "int32":
            got = None if ia is None else (tuple(ia.shape), dtype_name(ia.dtype))
            raise ShapeError(f"{op}: indices must be int32 of shape {tuple(want)}, got {got}",
                             hint="pass the indices of max_pool2d_with_indices")
        mc.contiguous(ia, "indices")
    res = run("pool2d", key, bound, ("dy", "indices"), {}, plan=plan)
    return bound.wrap(res["dx"])


def max_pool2d_backward(dy: Any, indices: Any, input_shape: Any, kernel: Any,
                        stride: Any = None, padding: Any = 0, dilation: Any = 1,
                        ceil_mode: bool = False, layout: str = "NCHW", plan: Any = None) -> Any:
    """dx of :func:`max_pool2d` from ``dy`` and the forward's ``indices`` (of
    :func:`max_pool2d_with_indices`); ``input_shape`` is x's shape."""
    return _backward("max", dy, indices, input_shape, kernel, stride, padding, dilation,
                     ceil_mode, True, layout, plan)


def avg_pool2d_backward(dy: Any, input_shape: Any, kernel: Any, stride: Any = None,
                        padding: Any = 0, ceil_mode: bool = False,
                        count_include_pad: bool = True, layout: str = "NCHW",
                        plan: Any = None) -> Any:
    """dx of :func:`avg_pool2d` (same divisor rule); ``input_shape`` is x's shape."""
    return _backward("avg", dy, None, input_shape, kernel, stride, padding, 1, ceil_mode,
                     count_include_pad, layout, plan)


def global_avg_pool2d_backward(dy: Any, input_shape: Any, layout: str = "NCHW",
                               plan: Any = None) -> Any:
    """dx of :func:`global_avg_pool2d`: dy (N, C, 1, 1) / (N, 1, 1, C) spread over H x W."""
    bound = bind(dy)
    ga = bound.arrays[0]
    dtype = mc.float_dtype(ga, "dy")
    mc.contiguous(ga, "dy")
    layout = mc.check_layout(layout)
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 4 or 0 in shape:
        raise ShapeError(f"global_avg_pool2d_backward: input_shape {shape} is not a non-empty "
                         "4-D shape")
    n, a, b, d = shape
    n, c, h, w = (n, a, b, d) if layout == "NCHW" else (n, d, a, b)
    want = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
    if tuple(ga.shape) != want:
        raise ShapeError(f"global_avg_pool2d_backward: dy has shape {tuple(ga.shape)}, "
                         f"expected {want}")
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout,
           "pass": "backward"}
    return bound.wrap(run("global_avg_pool2d", key, bound, ("dy",), {}, plan=plan)["dx"])
