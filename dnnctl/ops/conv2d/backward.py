"""conv2d backward problems: the data gradient (``pass: dgrad``) and the weight gradient
(``pass: wgrad``) of the forward key they come from.

dgrad: inputs dy (the forward's y shape, in the layout) and w -> output dx (x's shape).
wgrad: inputs x and dy -> output dw (w's shape), plus db (K,) when the key says bias=true
(the bias gradient, a sum of dy over N*P*Q, fused by the variants that can).
A backward key has no epilogue: activation none and residual false (the activation's
derivative belongs to the activation's own backward); bias means "also db" for wgrad and
must be false for dgrad.

Tolerances: dgrad sums C/g*R*S/stride^2-ish terms per element, as the forward does; wgrad
sums N*P*Q terms per weight, so float32 accumulation error grows with sqrt(N*P*Q)
(pairwise or split-K orders keep it far below that bound; the tolerance admits it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops.base import Problem, TensorSpec, np_dtype
from dnnctl.ops.conv2d.geom import (
    NCHW_TRANSPOSE_FLOPS,
    ConvGeom,
    from_nchw,
    geometry,
    to_nchw,
)


def check(key: dict[str, Any]) -> None:
    """A backward key carries no epilogue; bias is db (wgrad only)."""
    which = key["pass"]
    if key["activation"] != "none" or key["residual"]:
        raise UsageError(
            f"conv2d {which}: activation / residual belong to the forward key",
            hint="give activation none and residual false; run the activation's backward "
                 "first and pass its output as dy")
    if which == "dgrad" and key["bias"]:
        raise UsageError("conv2d dgrad: bias=true has no meaning for the data gradient",
                         hint="the bias gradient is part of wgrad (bias: true there)")


def input_specs(g: ConvGeom) -> dict[str, TensorSpec]:
    if g.pass_ == "dgrad":
        return {"dy": TensorSpec(g.y_shape(), g.dtype), "w": TensorSpec(g.w_shape(), g.dtype)}
    return {"x": TensorSpec(g.x_shape(), g.dtype), "dy": TensorSpec(g.y_shape(), g.dtype)}


def output_specs(g: ConvGeom) -> dict[str, TensorSpec]:
    if g.pass_ == "dgrad":
        return {"dx": TensorSpec(g.x_shape(), g.dtype)}
    out = {"dw": TensorSpec(g.w_shape(), g.dtype)}
    if g.bias:
        out["db"] = TensorSpec((g.k,), g.dtype)
    return out


def make_inputs(g: ConvGeom, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Normal dy and x; w scaled by 1/sqrt(K/g*R*S) (dx stays O(1)); for wgrad dy scaled by
    1/sqrt(N*P*Q) so dw and db stay O(1) in fp16 whatever the batch."""
    dt = np_dtype(g.dtype)
    if g.pass_ == "dgrad":
        scale = 1.0 / math.sqrt(g.kg * g.r * g.s)
        return {"dy": rng.standard_normal(g.y_shape(), dtype=np.float32).astype(dt),
                "w": (rng.standard_normal(g.w_shape(), dtype=np.float32) * scale).astype(dt)}
    scale = 1.0 / math.sqrt(g.npq)
    return {"x": rng.standard_normal(g.x_shape(), dtype=np.float32).astype(dt),
            "dy": (rng.standard_normal(g.y_shape(), dtype=np.float32) * scale).astype(dt)}


def _tap_slices(g: ConvGeom, r: int, s: int) -> tuple[slice, slice]:
    h0, w0 = r * g.dh, s * g.dw
    return (slice(h0, h0 + (g.p - 1) * g.sh + 1, g.sh), slice(w0, w0 + (g.q - 1) * g.sw + 1,
                                                              g.sw))


def dgrad_nchw(dy: np.ndarray, w: np.ndarray, g: ConvGeom) -> np.ndarray:
    """dx (N, C, H, W) of NCHW dy and (K, C/g, R, S) w, in dy's dtype: the adjoint of
    conv_nchw, scattering one tap at a time into the padded input."""
    hp, wp = g.h + g.pt + g.pb, g.w + g.pl + g.pr
    dxp = np.zeros((g.n, g.groups, g.cg, hp, wp), dtype=dy.dtype)
    dyg = dy.reshape(g.n, g.groups, g.kg, g.p * g.q)
    wg = w.reshape(g.groups, g.kg, g.cg, g.r, g.s)
    for r in range(g.r):
        for s in range(g.s):
            hs, ws = _tap_slices(g, r, s)
            # (G, Cg, Kg) @ (N, G, Kg, PQ) -> (N, G, Cg, PQ)
            contrib = np.matmul(wg[:, :, :, r, s].transpose(0, 2, 1), dyg)
            dxp[:, :, :, hs, ws] += contrib.reshape(g.n, g.groups, g.cg, g.p, g.q)
    dx = dxp[:, :, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w]
    return dx.reshape(g.n, g.c, g.h, g.w)


def wgrad_nchw(x: np.ndarray, dy: np.ndarray, g: ConvGeom) -> np.ndarray:
    """dw (K, C/g, R, S) of NCHW x and dy, in x's dtype."""
    xp = np.pad(x, ((0, 0), (0, 0), (g.pt, g.pb), (g.pl, g.pr)))
    xg = xp.reshape(g.n, g.groups, g.cg, xp.shape[2], xp.shape[3])
    dyg = dy.reshape(g.n, g.groups, g.kg, g.p * g.q)
    dw = np.zeros((g.groups, g.kg, g.cg, g.r, g.s), dtype=x.dtype)
    for r in range(g.r):
        for s in range(g.s):
            hs, ws = _tap_slices(g, r, s)
            tap = xg[:, :, :, hs, ws].reshape(g.n, g.groups, g.cg, g.p * g.q)
            # sum over n and pq: (G, Kg, N*PQ) @ (G, N*PQ, Cg)
            a = dyg.transpose(1, 2, 0, 3).reshape(g.groups, g.kg, -1)
            b = tap.transpose(1, 0, 3, 2).reshape(g.groups, -1, g.cg)
            dw[:, :, :, r, s] = np.matmul(a, b)
    return dw.reshape(g.k, g.cg, g.r, g.s)


def reference(problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 dx, or dw (and db), in the problem's layout."""
    g = geometry(problem)

    def nchw(name: str) -> np.ndarray:
        return np.ascontiguousarray(to_nchw(np.asarray(inputs[name], dtype=np.float64),
                                            g.layout))

    if g.pass_ == "dgrad":
        dx = dgrad_nchw(nchw("dy"), nchw("w"), g)
        return {"dx": np.ascontiguousarray(from_nchw(dx, g.layout))}
    dy = nchw("dy")
    dw = wgrad_nchw(nchw("x"), dy, g)
    out = {"dw": np.ascontiguousarray(from_nchw(dw, g.layout))}
    if g.bias:
        out["db"] = dy.sum(axis=(0, 2, 3))
    return out


def tolerance(problem: Problem, output: str) -> float:
    """As the forward for dgrad; wgrad / db widen fp32 and tf32 by sqrt(N*P*Q / 4096)."""
    g = geometry(problem)
    if g.dtype == "float32":
        base = 1e-3 if g.tf32 else 1e-5
    else:
        base = {"float16": 2e-3, "bfloat16": 8e-3}[g.dtype]
    if g.pass_ == "wgrad" and g.dtype == "float32":
        base *= max(1.0, math.sqrt(g.npq / 4096))
    return base


def preference(g: ConvGeom, backend: str) -> list[str]:
    """Variant names to try, best first, for a backward problem nobody tuned.

    Backward variants are named ``<pass>_<algorithm>`` (the registry holds one name per op
    and backend). numpy: the column-matrix GEMM unless groups are tiny. CUDA: the depthwise
    kernels for depthwise; a 1x1 stride-1 unpadded layer is one cuBLAS GEMM (im2col_gemm
    with no columns); tensor-core math goes to the implicit GEMMs (dgrad by stride phases,
    wgrad with a deterministic split-K; NCHW through NHWC transposes once the convolution
    repays them, as forward); exact float32 3x3 stride-1 dgrad to Winograd;
    cuBLAS over explicit columns next; the direct kernels take anything left.
    """
    pre = g.pass_ + "_"
    if backend == "numpy":
        if g.groups > 1 and g.cg * g.kg <= 64:
            return [pre + "direct", pre + "im2col_gemm"]
        return [pre + "im2col_gemm", pre + "direct"]
    tensor_cores = g.dtype in ("float16", "bfloat16") or g.tf32
    order: list[str] = []
    if g.depthwise:
        order.append("depthwise")
        if g.pass_ == "dgrad" and g.nhwc:
            order.append("depthwise_tile")
    if g.identity and not g.depthwise:
        order.append("im2col_gemm")
    if tensor_cores and not g.depthwise:
        big = 2.0 * g.npq * g.k * g.crs >= NCHW_TRANSPOSE_FLOPS
        if g.nhwc:
            order.append("implicit_gemm")
        elif g.pass_ == "dgrad":
            order += ["nhwc_implicit_gemm", "implicit_gemm"] if big else ["implicit_gemm"]
        elif big:
            order.append("nhwc_implicit_gemm")
    if g.pass_ == "dgrad" and not tensor_cores and (g.r, g.s, g.sh, g.sw) == (3, 3, 1, 1) \
            and (g.dh, g.dw) == (1, 1) and g.groups == 1 and min(g.c, g.k) >= 64:
        order.append("winograd")
    if not g.depthwise:
        order.append("im2col_gemm")
    order.append("direct")
    return [pre + name for name in dict.fromkeys(order)]
