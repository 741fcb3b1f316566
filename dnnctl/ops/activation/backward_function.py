"""The public activation gradient calls (``dnnctl.ops.activation_backward``,
``relu_backward``, ...), dispatched like the forward."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.reference import FNS


def activation_backward(fn: str, dy: Any, x: Any, bias: Any = None, layout: str = "NCHW",
                        negative_slope: float = 0.01, plan: Any = None) -> Any:
    """Gradient of ``act(x [+ bias])`` for activation ``fn`` given the forward's input ``x``:
    dx, or ``(dx, dbias)`` with a per-channel ``bias`` (axis 1 for NCHW, last for NHWC)."""
    from dnnctl.ops.dispatch import bind, run

    if fn not in FNS:
        raise UsageError(f"unknown activation {fn!r}", hint=f"use one of {', '.join(FNS)}")
    bound = bind(dy, x, bias)
    ga, xa, ba = bound.arrays
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    mc.check_out(ga, tuple(xa.shape), dtype, "dy")
    layout = mc.check_layout(layout)
    key = {"fn": fn, "shape": tuple(xa.shape), "dtype": dtype,
           "bias": "none" if ba is None else "channel", "layout": layout, "pass": "backward"}
    if ba is not None:
        if xa.ndim < 2 and layout == "NCHW":
            raise UsageError("activation_backward: a NCHW channel bias needs rank >= 2",
                             hint="use layout='NHWC' for a bias on the last axis")
        mc.check_vector(ba, xa.shape[-1 if layout == "NHWC" else 1], dtype, "bias")
    res = run("activation", key, bound, ("dy", "x", "bias"),
              {"negative_slope": float(negative_slope)}, plan=plan)
    dx = bound.wrap(res["dx"])
    return dx if ba is None else (dx, bound.wrap(res["dbias"]))


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


def leaky_relu_backward(dy: Any, x: Any, negative_slope: float = 0.01, bias: Any = None,
                        layout: str = "NCHW", plan: Any = None) -> Any:
    """Gradient of leaky_relu(x [+ bias]): dx, or (dx, dbias) with a channel bias."""
    return activation_backward("leaky_relu", dy, x, bias, layout, negative_slope, plan)
