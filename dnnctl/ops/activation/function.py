"""The public activation calls (``dnnctl.ops.relu``, ``gelu``, ...): arrays -> problem key ->
planned variant -> launch."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, bias, out = arrays
    fn, inplace, layout, slope = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    shape = mc.nonempty_shape(x, fn)
    layout = mc.check_layout(layout)
    if bias is not None:
        if layout == "NCHW" and len(shape) < 2:
            raise ShapeError(f"{fn}: a bias with layout NCHW needs x of rank >= 2, got {shape}",
                             hint="pass layout='NHWC' for a bias on the last axis")
        mc.check_vector(bias, shape[1] if layout == "NCHW" else shape[-1], dtype, "bias")
    if out is not None:
        mc.check_out(out, shape, dtype)
        same = mc.same_memory(out, x)
        if inplace and not same:
            raise ShapeError(f"{fn}: inplace=True but out is not x",
                             hint="pass out=x or leave out unset")
        inplace = inplace or same
    key = {"fn": fn, "shape": shape, "dtype": dtype,
           "bias": "none" if bias is None else "channel", "layout": layout, "inplace": inplace}
    inputs = (("x", 0, None), ("bias", 1, None))
    if out is not None:
        return Parsed("activation", key, inputs, (), (("y", 2),), {"negative_slope": slope},
                      result=2)
    if inplace:
        mc.writeable(x, "x (inplace=True)")
        return Parsed("activation", key, inputs, (), (("y", 0),), {"negative_slope": slope},
                      result=0)
    return Parsed("activation", key, inputs, (("y", shape, x.dtype),), (),
                  {"negative_slope": slope}, like={"y": 0})


_ACTIVATION = CallSpec("activation", _parse)


def relu(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """max(x [+ bias], 0). ``bias`` (C,) on the channel axis of ``layout``; NaN propagates."""
    return call(_ACTIVATION, (x, bias, out), ("relu", inplace, layout, 0.01), plan)


def leaky_relu(x: Any, negative_slope: float = 0.01, bias: Any = None, out: Any = None,
               plan: Any = None, *, inplace: bool = False, layout: str = "NCHW") -> Any:
    """x if x > 0 else negative_slope * x (after the optional channel bias)."""
    try:
        slope = float(negative_slope)
    except (TypeError, ValueError):
        slope = mc.as_float(negative_slope, "negative_slope")  # raises, naming it
    return call(_ACTIVATION, (x, bias, out), ("leaky_relu", inplace, layout, slope), plan)


def gelu(x: Any, approximate: str = "none", bias: Any = None, out: Any = None,
         plan: Any = None, *, inplace: bool = False, layout: str = "NCHW") -> Any:
    """GELU, exact erf form (``approximate='none'``) or the tanh form (``'tanh'``)."""
    if approximate not in ("none", "tanh"):
        raise UsageError(f"gelu: approximate={approximate!r}", hint="use 'none' or 'tanh'")
    fn = "gelu" if approximate == "none" else "gelu_tanh"
    return call(_ACTIVATION, (x, bias, out), (fn, inplace, layout, 0.01), plan)


def silu(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """x * sigmoid(x) (after the optional channel bias)."""
    return call(_ACTIVATION, (x, bias, out), ("silu", inplace, layout, 0.01), plan)


def sigmoid(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
            inplace: bool = False, layout: str = "NCHW") -> Any:
    """1 / (1 + exp(-x)) (after the optional channel bias)."""
    return call(_ACTIVATION, (x, bias, out), ("sigmoid", inplace, layout, 0.01), plan)


def tanh(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """tanh(x) (after the optional channel bias)."""
    return call(_ACTIVATION, (x, bias, out), ("tanh", inplace, layout, 0.01), plan)


def relu6(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
          inplace: bool = False, layout: str = "NCHW") -> Any:
    """min(max(x, 0), 6) (after the optional channel bias); NaN propagates (MobileNetV2)."""
    return call(_ACTIVATION, (x, bias, out), ("relu6", inplace, layout, 0.01), plan)


def hardswish(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
              inplace: bool = False, layout: str = "NCHW") -> Any:
    """x * relu6(x + 3) / 6 (after the optional channel bias; MobileNetV3)."""
    return call(_ACTIVATION, (x, bias, out), ("hardswish", inplace, layout, 0.01), plan)


def hardsigmoid(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
                inplace: bool = False, layout: str = "NCHW") -> Any:
    """relu6(x + 3) / 6 (after the optional channel bias; MobileNetV3's squeeze-excite)."""
    return call(_ACTIVATION, (x, bias, out), ("hardsigmoid", inplace, layout, 0.01), plan)
