"""The public activation gradient calls (``dnnctl.ops.activation_backward``,
``relu_backward``, ...), on the forward's call pipeline."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.reference import FNS
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, x, bias = arrays
    fn, layout, slope = scalars
    if fn not in FNS:
        raise UsageError(f"unknown activation {fn!r}", hint=f"use one of {', '.join(FNS)}")
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    shape = tuple(x.shape)
    mc.check_out(dy, shape, dtype, "dy")
    layout = mc.check_layout(layout)
    key = {"fn": fn, "shape": shape, "dtype": dtype,
           "bias": "none" if bias is None else "channel", "layout": layout, "pass": "backward"}
    if bias is not None:
        if x.ndim < 2 and layout == "NCHW":
            raise UsageError("activation_backward: a NCHW channel bias needs rank >= 2",
                             hint="use layout='NHWC' for a bias on the last axis")
        mc.check_vector(bias, shape[-1 if layout == "NHWC" else 1], dtype, "bias")
    attrs = {"negative_slope": mc.as_float(slope, "negative_slope")}
    return Parsed("activation", key, (("dy", 0, None), ("x", 1, None), ("bias", 2, None)),
                  spec_outputs("activation", key), (), attrs,
                  result="dx" if bias is None else ("dx", "dbias"))


_BACKWARD = CallSpec("activation_backward", _parse, ("dy",))


def activation_backward(fn: str, dy: Any, x: Any, bias: Any = None, layout: str = "NCHW",
                        negative_slope: float = 0.01, plan: Any = None) -> Any:
    """Gradient of ``act(x [+ bias])`` for activation ``fn`` given the forward's input ``x``:
    dx, or ``(dx, dbias)`` with a per-channel ``bias`` (axis 1 for NCHW, last for NHWC)."""
    return call(_BACKWARD, (dy, x, bias), (fn, layout, negative_slope), plan)


def _named(fn: str) -> Any:
    def grad(dy: Any, x: Any, bias: Any = None, layout: str = "NCHW", plan: Any = None) -> Any:
        return activation_backward(fn, dy, x, bias, layout, plan=plan)

    grad.__name__ = grad.__qualname__ = f"{fn}_backward"
    grad.__doc__ = (f"Gradient of {fn}(x [+ bias]): dx, or (dx, dbias) with a channel bias "
                    "(see activation_backward).")
    return grad


relu_backward = _named("relu")
gelu_backward = _named("gelu")
gelu_tanh_backward = _named("gelu_tanh")
silu_backward = _named("silu")
sigmoid_backward = _named("sigmoid")
tanh_backward = _named("tanh")
relu6_backward = _named("relu6")
hardswish_backward = _named("hardswish")
hardsigmoid_backward = _named("hardsigmoid")


def leaky_relu_backward(dy: Any, x: Any, negative_slope: float = 0.01, bias: Any = None,
                        layout: str = "NCHW", plan: Any = None) -> Any:
    """Gradient of leaky_relu(x [+ bias]): dx, or (dx, dbias) with a channel bias."""
    return activation_backward("leaky_relu", dy, x, bias, layout, negative_slope, plan)
