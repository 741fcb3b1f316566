"""The public ``dnnctl.ops.conv2d`` call: shapes -> problem key -> planned variant -> launch."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import dtype_name
from dnnctl.ops.conv2d.op import ACTIVATIONS, LAYOUTS, canonical_pad, output_size
from dnnctl.ops.dispatch import PlanLike, Prepared, SiteCache, bind, run, signature


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


def conv2d(x: Any, w: Any, bias: Any = None, stride: int | Sequence[int] = 1,
           padding: int | str | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
           groups: int = 1, activation: str | None = None, residual: Any = None,
           layout: str = "NCHW", tf32: bool = False, plan: PlanLike | None = None) -> Any:
    """2-D convolution with fused ``+ bias -> activation -> + residual``.

    ``x`` is (N, C, H, W) for layout NCHW or (N, H, W, C) for NHWC; ``w`` is (K, C/groups, R, S)
    or (K, R, S, C/groups). NumPy arrays run on the numpy backend, CuPy arrays and DLPack CUDA
    tensors (e.g. torch, zero-copy) on the GPU; the result is of the input's kind. The variant
    is the plan's choice for this shape (``plan`` or the active one), else the default heuristic.
    """
    try:  # a signature seen before: no validation
        prep = _FAST[(signature(x), signature(w), signature(bias), signature(residual), stride,
                      padding, dilation, groups, activation, layout, tf32)]
    except (AttributeError, KeyError, TypeError):
        pass
    else:
        ins = {"x": x, "w": w}
        if bias is not None:
            ins["bias"] = bias
        if residual is not None:
            ins["residual"] = residual
        return prep.run(ins, plan)["y"]
    if layout not in LAYOUTS:
        raise UsageError(f"conv2d: layout={layout!r} is not one of {list(LAYOUTS)}")
    act = "none" if activation is None else str(activation)
    if act not in ACTIVATIONS:
        raise UsageError(f"conv2d: activation={activation!r} is not supported",
                         hint="use None, 'relu', 'gelu' or 'silu'")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise UsageError(f"conv2d: groups={groups!r} must be a positive int")
    bound = bind(x, w, bias, residual)
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        xa, wa, ba, ra = bound.arrays
        return bound.wrap(conv2d(xa, wa, ba, stride, padding, dilation, groups, activation, ra,
                                 layout, tf32, plan))
    xp = bound.backend.xp
    given = tuple(bound.arrays)
    arrays = [None if a is None else xp.ascontiguousarray(a) for a in bound.arrays]
    bound.arrays = arrays
    xa, wa, ba, ra = arrays
    nhwc = layout == "NHWC"
    if len(xa.shape) != 4:
        raise ShapeError(f"conv2d: x has shape {_shape(xa)}, expected 4 dims "
                         f"({'N, H, W, C' if nhwc else 'N, C, H, W'})")
    if len(wa.shape) != 4:
        raise ShapeError(f"conv2d: w has shape {_shape(wa)}, expected 4 dims "
                         f"({'K, R, S, C/groups' if nhwc else 'K, C/groups, R, S'})")
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
    if ra is not None:
        y_shape = (n, p, q, k) if nhwc else (n, k, p, q)
        if _shape(ra) != y_shape:
            raise ShapeError(f"conv2d: residual has shape {_shape(ra)}, expected {y_shape} "
                             f"(the shape of y)")
    key = {"n": n, "c": c, "h": h, "w": wd, "k": k, "r": r, "s": s, "stride": st,
           "pad": pad, "dilation": dil, "groups": groups, "dtype": dtype, "layout": layout,
           "bias": ba is not None, "activation": act, "residual": ra is not None,
           "tf32": bool(tf32)}
    if all(a is g for a, g in zip(arrays, given)):  # no copies: a repeated call is this call
        prep = Prepared("conv2d", key, bound, {})
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put((signature(x), signature(w), signature(bias), signature(residual), stride,
                       padding, dilation, groups, activation, layout, tf32), prep)
        ins = {n: a for n, a in zip(("x", "w", "bias", "residual"), arrays) if a is not None}
        return prep.run(ins, plan)["y"]
    out = run("conv2d", key, bound, ("x", "w", "bias", "residual"), {}, plan=plan)
    return bound.wrap(out["y"])


_FAST = SiteCache()
