"""The activations and their gradients in NumPy: the float64 reference of the op's
forward and backward passes and the arithmetic of its numpy variants (float32).

GELU uses forms without cancellation for negative x, as the kernels do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Problem

FNS: tuple[str, ...] = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh",
                        "relu6", "hardswish", "hardsigmoid")
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_K_TANH = math.sqrt(2.0 / math.pi)


def act_numpy(fn: str, x: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """The activation in x's float precision (float64 for the reference, float32 on CPU).

    GELU uses forms without cancellation for negative x (as the kernels do):
    0.5 x erfc(-x / sqrt 2) and, for the tanh form, x / (1 + exp(-2 u)) = 0.5 x (1 + tanh u).
    """
    with np.errstate(all="ignore"):
        if fn == "relu":
            return np.maximum(x, 0)  # NaN propagates, as in torch and the kernels
        if fn == "leaky_relu":
            return np.where(x > 0, x, x * slope)
        if fn == "gelu":
            return 0.5 * x * mc.erfc(-x * _SQRT1_2).astype(x.dtype, copy=False)
        if fn == "gelu_tanh":
            return x / (1.0 + np.exp(-2.0 * _K_TANH * (x + 0.044715 * x * x * x)))
        if fn == "silu":
            return x / (1.0 + np.exp(-x))
        if fn == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if fn == "tanh":
            return np.tanh(x)
        if fn == "relu6":
            return np.minimum(np.maximum(x, 0), 6)  # NaN propagates
        if fn == "hardswish":
            return x * np.minimum(np.maximum(x + 3, 0), 6) / 6
        if fn == "hardsigmoid":
            return np.minimum(np.maximum(x + 3, 0), 6) / 6
    raise UsageError(f"unknown activation {fn!r}", hint=f"use one of {', '.join(FNS)}")


def act_grad_numpy(fn: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """d act / dz in z's precision; NaN propagates."""
    with np.errstate(all="ignore"):
        if fn == "relu":
            out = np.where(z > 0, 1.0, 0.0).astype(z.dtype)
        elif fn == "leaky_relu":
            out = np.where(z > 0, 1.0, slope).astype(z.dtype)
        elif fn == "gelu":
            cdf = 0.5 * mc.erfc(-z / math.sqrt(2.0)).astype(z.dtype, copy=False)
            out = cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        elif fn == "gelu_tanh":
            t = np.tanh(_K_TANH * (z + 0.044715 * z ** 3))
            out = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K_TANH * (1 + 3 * 0.044715 * z * z)
        elif fn in ("silu", "sigmoid"):
            s = 1.0 / (1.0 + np.exp(-z))
            out = s * (1 + z * (1 - s)) if fn == "silu" else s * (1 - s)
        elif fn == "tanh":
            out = 1.0 - np.tanh(z) ** 2
        elif fn == "relu6":  # torch's formulas at the kinks (hardtanh / hardswish backward)
            out = np.where((z > 0) & (z < 6), 1.0, 0.0).astype(z.dtype)
        elif fn == "hardswish":  # z / 3 + 1/2 strictly inside (-3, 3): 0 at -3, 1 at 3
            out = np.where(z <= -3, 0.0, np.where(z < 3, z / 3 + 0.5, 1.0)).astype(z.dtype)
        elif fn == "hardsigmoid":
            out = np.where((z > -3) & (z < 3), 1.0 / 6.0, 0.0).astype(z.dtype)
        else:
            raise UsageError(f"unknown activation {fn!r}")
        return np.where(np.isnan(z), z, out)


def broadcast_bias(problem: Problem, bias: np.ndarray) -> np.ndarray:
    """A (C,) bias shaped to broadcast over the channel axis of the problem's layout."""
    rank = len(problem["shape"])
    if problem["layout"] == "NHWC":
        return bias
    return bias.reshape((-1,) + (1,) * (rank - 2))


def act_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, bias: Any,
                       slope: float) -> dict[str, np.ndarray]:
    """dx = dy * act'(x [+ bias]) and, with a bias, dbias (dx summed per channel), in the
    inputs' precision (float64 sums of the bias gradient)."""
    z = x if bias is None else x + broadcast_bias(problem, bias)
    dx = dy * act_grad_numpy(problem["fn"], z, slope)
    out = {"dx": dx}
    if bias is not None:
        axes = tuple(i for i in range(dx.ndim)
                     if i != (dx.ndim - 1 if problem["layout"] == "NHWC" else 1))
        out["dbias"] = dx.sum(axis=axes, dtype=np.float64)
    return out
