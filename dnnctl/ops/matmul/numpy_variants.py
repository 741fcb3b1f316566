"""CPU matmul variants (numpy backend): one np.matmul call, or a cache-blocked loop.

Both accumulate in float32 (fp16 / bf16 inputs are upcast first), apply the epilogue in
float32 and round once to the output dtype, as the GPU kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import Problem
from dnnctl.ops.matmul.op import logical_operands
from dnnctl.ops.passes import NumpyVariant
from dnnctl.ops.registry import register_variant

# Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7) evaluated in float32: < 5e-7 in all.
_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf32(x: np.ndarray) -> np.ndarray:
    """Vectorized float32 erf (numpy has none)."""
    ax = np.abs(x)
    t = 1.0 / (1.0 + _P * ax)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    y = 1.0 - poly * np.exp(-ax * ax)
    return np.copysign(y, x).astype(np.float32)


def epilogue32(y: np.ndarray, bias: np.ndarray | None, activation: str) -> np.ndarray:
    """+ bias, then the activation, on a float32 array (in place where possible)."""
    if bias is not None:
        y += bias.astype(np.float32)
    if activation == "relu":
        np.maximum(y, 0.0, out=y)  # NaN propagates, as in the kernels
    elif activation == "gelu":
        y = 0.5 * y * (1.0 + erf32(y * np.float32(1.0 / math.sqrt(2.0))))
    elif activation == "silu":
        with np.errstate(over="ignore"):
            y = y / (1.0 + np.exp(-y))
    return y


def _operands32(problem: Problem, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    a, b = logical_operands(problem, np.asarray(inputs["a"]), np.asarray(inputs["b"]))
    return a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)


@register_variant
class NumpyMatmul(NumpyVariant):
    """One np.matmul (BLAS sgemm) over the whole batch."""

    op = "matmul"
    name = "numpy"
    doc = "np.matmul in float32 (BLAS), then bias + activation"

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        a, b = _operands32(problem, inputs)
        y = epilogue32(np.matmul(a, b), inputs.get("bias"), problem["activation"])
        out = outputs["y"]
        out[...] = y.reshape(out.shape).astype(out.dtype, copy=False)


@register_variant
class BlockedMatmul(NumpyVariant):
    """Row panels of ``block`` rows, each multiplied and finished while it is in cache."""

    op = "matmul"
    name = "blocked"
    params = {"block": (32, 64, 128, 256, 512)}
    doc = "row-panel blocked np.matmul with the epilogue fused per panel"

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        # a panel as tall as the matrix is the plain variant; keep one such candidate only
        return params["block"] < problem["m"] or params["block"] == 32

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        return {"block": 128}

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        act, block, m = problem["activation"], int(params["block"]), problem["m"]
        a, b = _operands32(problem, inputs)
        bias = inputs.get("bias")
        out = outputs["y"].reshape((problem["batch"], m, problem["n"]))
        for i in range(a.shape[0]):
            for r0 in range(0, m, block):
                y = np.matmul(a[i, r0:r0 + block], b[i])
                out[i, r0:r0 + block] = epilogue32(y, bias, act).astype(out.dtype)
