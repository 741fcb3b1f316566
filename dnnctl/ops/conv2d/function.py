"""The public ``dnnctl.ops.conv2d`` call: shapes -> problem key -> planned variant -> launch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import dtype_name
from dnnctl.ops.conv2d.op import ACTIVATIONS, LAYOUTS, canonical_pad, output_size
from dnnctl.ops.dispatch import CallSpec, Parsed, PlanLike, call


def _pair(name: str, value: int | Sequence[int]) -> tuple[int, int]:
    vals = (value, value) if isinstance(value, int) else tuple(value) if isinstance(
        value, (tuple, list)) else ()
    if len(vals) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                 for v in vals):
        raise UsageError(f"conv2d: {name}={value!r} must be an int >= 1 or two of them",
                         hint=f"e.g. {name}=1 or {name}=(2, 2)")
    return (int(vals[0]), int(vals[1]))


def _padding(padding: int | str | Sequence[int], r: int, s: int, stride: tuple[int, int],
             dilation: tuple[int, int]) -> tuple[int, ...]:
    """int, (ph, pw), (top, bottom, left, right), 'valid' or 'same' (stride 1, as torch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise UsageError("conv2d: padding='same' needs stride 1",
                                 hint="give explicit padding for strided convolutions")
            th, tw = dilation[0] * (r - 1), dilation[1] * (s - 1)
            return canonical_pad((th // 2, th - th // 2, tw // 2, tw - tw // 2))
        raise UsageError(f"conv2d: padding={padding!r} is not 'same', 'valid' or ints")
    vals = (padding,) if isinstance(padding, int) else tuple(padding)
    if len(vals) not in (1, 2, 4) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vals):
        raise UsageError(f"conv2d: padding={padding!r} must be 1, 2 or 4 ints >= 0",
                         hint="padding is p, (ph, pw) or (top, bottom, left, right)")
    return canonical_pad(tuple(int(v) for v in vals))


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in a.shape)


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    stride, padding, dilation, groups, activation, layout, tf32, before_act = scalars
    if layout not in LAYOUTS:
        raise UsageError(f"conv2d: layout={layout!r} is not one of {list(LAYOUTS)}")
    act = "none" if activation is None else str(activation)
    if act not in ACTIVATIONS:
        raise UsageError(f"conv2d: activation={activation!r} is not supported",
                         hint="use None, 'relu', 'gelu', 'silu', 'relu6' or 'hardswish'")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise UsageError(f"conv2d: groups={groups!r} must be a positive int")
    copies = [None if a is None else xp.ascontiguousarray(a) for a in arrays]
    xa, wa, ba, ra = copies
    if wa is None:
        raise ShapeError("conv2d: w is missing", hint="pass the filter as the second argument")
    nhwc = layout == "NHWC"
    if len(xa.shape) != 4:
        raise ShapeError(f"conv2d: x has shape {_shape(xa)}, expected 4 dims "
                         f"({'N, H, W, C' if nhwc else 'N, C, H, W'})")
    if len(wa.shape) != 4:
        raise ShapeError(f"conv2d: w has shape {_shape(wa)}, expected 4 dims "
                         f"({'K, R, S, C/groups' if nhwc else 'K, C/groups, R, S'})")
    if 0 in xa.shape or 0 in wa.shape:
        raise ShapeError(f"conv2d: x {_shape(xa)} and w {_shape(wa)} must not be empty")
    if nhwc:
        n, h, wd, c = _shape(xa)
        k, r, s, cg = _shape(wa)
    else:
        n, c, h, wd = _shape(xa)
        k, cg, r, s = _shape(wa)
    if cg * groups != c:
        raise ShapeError(
            f"conv2d: w has shape {_shape(wa)} with {cg} input channels per group, expected "
            f"C/groups = {c}/{groups}" + ("" if c % groups == 0 else " (C is not divisible)"),
            hint=f"w is {'(K, R, S, C/groups)' if nhwc else '(K, C/groups, R, S)'} "
                 f"for layout {layout}")
    dtype = dtype_name(xa.dtype)
    for name, arr in (("w", wa), ("bias", ba), ("residual", ra)):
        if arr is not None and dtype_name(arr.dtype) != dtype:
            raise ShapeError(f"conv2d: {name} has dtype {dtype_name(arr.dtype)}, expected "
                             f"{dtype} (the dtype of x)", hint="cast every input to one dtype")
    st, dil = _pair("stride", stride), _pair("dilation", dilation)
    pad = _padding(padding, r, s, st, dil)
    if ba is not None and _shape(ba) != (k,):
        raise ShapeError(f"conv2d: bias has shape {_shape(ba)}, expected ({k},)")
    p, q = output_size(h, wd, r, s, st, pad, dil)
    y_shape = (n, p, q, k) if nhwc else (n, k, p, q)
    if ra is not None and _shape(ra) != y_shape:
        raise ShapeError(f"conv2d: residual has shape {_shape(ra)}, expected {y_shape} "
                         f"(the shape of y)")
    key = {"n": n, "c": c, "h": h, "w": wd, "k": k, "r": r, "s": s, "stride": st,
           "pad": pad, "dilation": dil, "groups": groups, "dtype": dtype, "layout": layout,
           "bias": ba is not None, "activation": act, "residual": ra is not None,
           "residual_before_act": bool(before_act),
           "tf32": bool(tf32)}
    outputs = (("y", y_shape, xa.dtype),)
    if all(a is g for a, g in zip(copies, arrays)):  # no copies: pointers suffice
        inputs = (("x", 0, None), ("w", 1, None), ("bias", 2, None), ("residual", 3, None))
        return Parsed("conv2d", key, inputs, outputs)

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        names = ("x", "w", "bias", "residual")
        return {nm: xp.ascontiguousarray(a) for nm, a in zip(names, back) if a is not None}

    return Parsed("conv2d", key, (), outputs, prepare=prepare)


_CONV2D = CallSpec("conv2d", _parse, ("x", "w"))


def _nhwc(a: Any) -> Any:
    """The (N, H, W, C) view of a logical (N, C, H, W) array (no copy)."""
    return a.transpose(0, 2, 3, 1)


def _parse_channels_last(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    """The NHWC problem of logical (N, C, H, W) x / w / residual stored channels-last (torch
    ``channels_last`` tensors as they are): pointer kernels read the arrays themselves (the
    NHWC memory), the others get their (N, H, W, C) views, and only an array that is not
    stored channels-last is copied. Kernels see ``attrs["channels_last"]``."""
    x, w, b, r = arrays
    for name, a in (("x", x), ("w", w), ("residual", r)):
        if a is not None and len(a.shape) != 4:
            raise ShapeError(f"conv2d: {name} has shape {_shape(a)}, expected 4 dims "
                             "(N, C, H, W) stored channels-last")
    views = (_nhwc(x), _nhwc(w), b, None if r is None else _nhwc(r))
    parsed = _parse(views, (*scalars[:5], "NHWC", *scalars[6:]), xp)
    if parsed.prepare is None:
        inputs = (("x", 0, _nhwc), ("w", 1, _nhwc), ("bias", 2, None), ("residual", 3, _nhwc))
        return Parsed("conv2d", parsed.key, inputs, parsed.outputs,
                      attrs={"channels_last": True})
    prepare = parsed.prepare

    def prepare_views(back: tuple[Any, ...]) -> dict[str, Any]:
        return prepare(tuple(a if a is None or len(a.shape) != 4 else _nhwc(a) for a in back))

    return Parsed("conv2d", parsed.key, (), parsed.outputs, prepare=prepare_views)


_CONV2D_CL = CallSpec("conv2d", _parse_channels_last, ("x", "w"))


def conv2d_channels_last(x: Any, w: Any, bias: Any = None, stride: Sequence[int] = (1, 1),
                         padding: Sequence[int] = (0, 0), dilation: Sequence[int] = (1, 1),
                         groups: int = 1, activation: str | None = None, residual: Any = None,
                         tf32: bool = False, residual_before_act: bool = False,
                         plan: PlanLike | None = None) -> Any:
    """conv2d (layout NHWC) of logical (N, C, H, W) ``x``, ``w`` and ``residual`` stored
    channels-last, as torch's ``channels_last`` tensors are, with no view made per call:
    what :mod:`dnnctl.torch` calls. The result is y's (N, P, Q, K) array."""
    return call(_CONV2D_CL, (x, w, bias, residual),
                (stride, padding, dilation, groups, activation, "NHWC", bool(tf32),
                 bool(residual_before_act)), plan)


def conv2d(x: Any, w: Any, bias: Any = None, stride: int | Sequence[int] = 1,
           padding: int | str | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
           groups: int = 1, activation: str | None = None, residual: Any = None,
           layout: str = "NCHW", tf32: bool = False, residual_before_act: bool = False,
           plan: PlanLike | None = None) -> Any:
    """2-D convolution with fused ``+ bias -> activation -> + residual``, or with
    ``residual_before_act`` ``+ bias -> + residual -> activation`` (a ResNet block's end:
    ``relu(bn(conv(x)) + identity)``).

    ``x`` is (N, C, H, W) for layout NCHW or (N, H, W, C) for NHWC; ``w`` is (K, C/groups, R, S)
    or (K, R, S, C/groups). NumPy arrays run on the numpy backend, CuPy arrays and torch CUDA
    tensors on the GPU (torch by pointer, on torch's current stream); the result is of the
    input's kind. The variant is the plan's choice for this shape (``plan`` or the active
    one), else the default heuristic.
    """
    return call(_CONV2D, (x, w, bias, residual),
                (stride, padding, dilation, groups, activation, layout, bool(tf32),
                 bool(residual_before_act)), plan)
