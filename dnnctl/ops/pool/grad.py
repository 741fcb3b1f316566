"""Public pooling functions of the training path: max pooling with indices and the backward
of max / avg / global-avg pooling (op keys ``indices: true`` and ``pass: backward``)."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Field, dtype_name
from dnnctl.ops.dispatch import CallSpec, Parsed, call, problem_of, spec_outputs
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


def _parse_indices(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, = arrays
    kernel, stride, padding, dilation, ceil_mode, layout = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(layout)
    key = _key("max_pool2d_with_indices", "max", tuple(x.shape), dtype, kernel, stride,
               padding, dilation, ceil_mode, True, layout)
    key["indices"] = True
    return Parsed("pool2d", key, (("x", 0, None),), spec_outputs("pool2d", key),
                  result=("y", "indices"))


_WITH_INDICES = CallSpec("max_pool2d_with_indices", _parse_indices)


def max_pool2d_with_indices(x: Any, kernel: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, layout: str = "NCHW",
                            plan: Any = None) -> tuple[Any, Any]:
    """Max pooling and its argmax: ``(y, indices)``, indices int32 of y's shape holding the
    flat position ih * W + iw within each (n, c) plane (PyTorch's return_indices)."""
    return call(_WITH_INDICES, (x,), (kernel, stride, padding, dilation, ceil_mode, layout),
                plan)


def _input_shape(op: str, input_shape: Any) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ShapeError(f"{op}: input_shape {input_shape!r} is not a shape",
                         hint="pass x.shape of the forward's input") from None


def _parse_backward(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, indices = arrays
    (mode, input_shape, kernel, stride, padding, dilation, ceil_mode, count_include_pad,
     layout) = scalars
    op = f"{mode}_pool2d_backward"
    dtype = mc.float_dtype(dy, "dy")
    mc.contiguous(dy, "dy")
    layout = mc.check_layout(layout)
    shape = _input_shape(op, input_shape)
    key = _key(op, mode, shape, dtype, kernel, stride, padding, dilation, ceil_mode,
               count_include_pad, layout)
    key["pass"] = "backward"
    pool = get_op("pool2d")
    want = tuple(pool.input_specs(problem_of(pool, key))["dy"].shape)
    if tuple(dy.shape) != want:
        raise ShapeError(f"{op}: dy has shape {tuple(dy.shape)}, expected {want} for "
                         f"input {shape}")
    if mode == "max":
        if (indices is None or tuple(indices.shape) != want
                or dtype_name(indices.dtype) != "int32"):
            got = None if indices is None else (tuple(indices.shape), dtype_name(indices.dtype))
            raise ShapeError(f"{op}: indices must be int32 of shape {want}, got {got}",
                             hint="pass the indices of max_pool2d_with_indices")
        mc.contiguous(indices, "indices")
    return Parsed("pool2d", key, (("dy", 0, None), ("indices", 1, None)),
                  spec_outputs("pool2d", key), result="dx")


_BACKWARD = CallSpec("pool2d_backward", _parse_backward)


def _backward(mode: str, dy: Any, indices: Any, input_shape: Any, kernel: Any, stride: Any,
              padding: Any, dilation: Any, ceil_mode: bool, count_include_pad: bool,
              layout: str, plan: Any) -> Any:
    return call(_BACKWARD, (dy, indices), (mode, input_shape, kernel, stride, padding, dilation,
                                           ceil_mode, count_include_pad, layout), plan)


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


def _parse_gap(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, = arrays
    dtype = mc.float_dtype(dy, "dy")
    mc.contiguous(dy, "dy")
    layout = mc.check_layout(scalars[1])
    shape = _input_shape("global_avg_pool2d_backward", scalars[0])
    if len(shape) != 4 or 0 in shape:
        raise ShapeError(f"global_avg_pool2d_backward: input_shape {shape} is not a non-empty "
                         "4-D shape")
    n, a, b, d = shape
    n, c, h, w = (n, a, b, d) if layout == "NCHW" else (n, d, a, b)
    want = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
    if tuple(dy.shape) != want:
        raise ShapeError(f"global_avg_pool2d_backward: dy has shape {tuple(dy.shape)}, "
                         f"expected {want}")
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout,
           "pass": "backward"}
    return Parsed("global_avg_pool2d", key, (("dy", 0, None),),
                  spec_outputs("global_avg_pool2d", key), result="dx")


_GAP_BACKWARD = CallSpec("global_avg_pool2d_backward", _parse_gap)


def global_avg_pool2d_backward(dy: Any, input_shape: Any, layout: str = "NCHW",
                               plan: Any = None) -> Any:
    """dx of :func:`global_avg_pool2d`: dy (N, C, 1, 1) / (N, 1, 1, C) spread over H x W."""
    return call(_GAP_BACKWARD, (dy,), (input_shape, layout), plan)
