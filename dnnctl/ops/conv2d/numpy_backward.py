"""conv2d dgrad / wgrad on the numpy backend: two real algorithms per pass.

* ``im2col_gemm`` — dgrad: one BLAS GEMM per group into a (N*P*Q, R*S*C/g) column matrix,
  then col2im (the column rows added back into the padded input, tap by tap); wgrad: the
  forward's patch matrix and one GEMM per group dy^T @ col, reducing over N*P*Q in BLAS.
* ``direct`` — tap by tap, no column matrix: dgrad adds dy @ w[r, s] into the strided view
  of the padded dx; wgrad multiplies the tap's strided input view by dy.

float32 compute (fp16 / bf16 upcast), NHWC inside; db (wgrad, bias=true) is dy summed over
N*P*Q in float32 (pairwise, numpy's sum).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dnnctl.ops.conv2d.numpy_variants import (
    ChunkedIm2col,
    Ranges,
    TapOrder,
    padded_nhwc,
    patches,
    tap,
    weights_rsck,
)
from dnnctl.ops.conv2d.op import ConvGeom
from dnnctl.ops.registry import register_variant


def dy_nhwc(dy: np.ndarray, g: ConvGeom) -> np.ndarray:
    """dy as float32 NHWC (N, P, Q, K)."""
    d = dy.astype(np.float32)
    return d if g.nhwc else d.transpose(0, 2, 3, 1)


def zero_dx(g: ConvGeom) -> np.ndarray:
    """A float32 NHWC gradient of the padded input, zeroed (for the taps to add into)."""
    return np.zeros((g.n, g.h + g.pt + g.pb, g.w + g.pl + g.pr, g.c), np.float32)


def store_dx(dxp: np.ndarray, g: ConvGeom, out: np.ndarray) -> None:
    """Crop the padded float32 NHWC gradient and write it in the problem's layout."""
    dx = dxp[:, g.pt:g.pt + g.h, g.pl:g.pl + g.w, :]
    out[...] = dx if g.nhwc else dx.transpose(0, 3, 1, 2)


def store_dw(dw_rsck: np.ndarray, g: ConvGeom, out: np.ndarray) -> None:
    """Write float32 (R, S, C/g, K) weights as (K, R, S, C/g) or (K, C/g, R, S)."""
    out[...] = dw_rsck.transpose(3, 0, 1, 2) if g.nhwc else dw_rsck.transpose(3, 2, 0, 1)


def store_db(dyn: np.ndarray, outputs: Mapping[str, Any]) -> None:
    if "db" in outputs:
        outputs["db"][...] = dyn.reshape(-1, dyn.shape[-1]).sum(axis=0)


def tap_view(xp: np.ndarray, g: ConvGeom, r: int, s: int) -> np.ndarray:
    """Writable strided view (N, P, Q, C) of the padded NHWC array under tap (r, s)."""
    return tap(xp, g, r, s)


def add_taps(dxp: np.ndarray, g: ConvGeom, term: Callable[[int, int], np.ndarray]) -> None:
    """col2im: add ``term(r, s)``, the tap's share as (n, P, Q, C) or (n, P, Q, G, C/g), into
    each filter tap's strided view of the padded gradient ``dxp``."""
    for r in range(g.r):
        for s in range(g.s):
            share = term(r, s)
            view = tap_view(dxp, g, r, s).reshape(share.shape)  # splits C: a view, no copy
            view += share


def _grouped(a: np.ndarray, b: np.ndarray, g: ConvGeom, a_t: bool) -> np.ndarray:
    """Per group (a_g^T if a_t else a_g) @ b_g; a (M, G*A), b (M or A, G*B) column blocks."""
    ga = a.reshape(a.shape[0], g.groups, -1).transpose(1, 0, 2)
    if a_t:
        ga = ga.transpose(0, 2, 1)
    gb = b.reshape(b.shape[0], g.groups, -1).transpose(1, 0, 2)
    return np.matmul(ga, gb)  # (G, ., .)


@register_variant
class NumpyDgradIm2col(ChunkedIm2col):
    """dgrad: column matrix by BLAS (dy @ w per group), then col2im tap by tap."""

    name = "dgrad_im2col_gemm"
    passes = ("dgrad",)
    doc = "dgrad: GEMM dy (N*P*Q, K/g) @ w (K/g, R*S*C/g) per group, then col2im"

    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        dyn = dy_nhwc(inputs["dy"], g)
        wt = weights_rsck(inputs["w"], g)  # (R, S, Cg, K)
        # per group (Kg, R*S*Cg): rows of w, columns in (r, s, c) order
        wm = wt.reshape(g.r * g.s, g.cg, g.groups, g.kg).transpose(2, 3, 0, 1)
        wm = wm.reshape(g.groups, g.kg, g.r * g.s * g.cg)
        dxp = zero_dx(g)
        for n0, n1 in ranges:
            rows = dyn[n0:n1].reshape(-1, g.groups, g.kg).transpose(1, 0, 2)
            col = np.matmul(rows, wm)  # (G, rows, RS*Cg)
            col = col.reshape(g.groups, n1 - n0, g.p, g.q, g.r * g.s, g.cg)
            add_taps(dxp[n0:n1], g, lambda r, s, col=col: col[:, :, :, :, r * g.s + s, :]
                     .transpose(1, 2, 3, 0, 4))  # (n, P, Q, G, Cg)
        store_dx(dxp, g, outputs["dx"])


@register_variant
class NumpyDgradDirect(TapOrder):
    """dgrad tap by tap: dx_pad[tap view] += dy @ w[r, s]^T, no column matrix."""

    name = "dgrad_direct"
    passes = ("dgrad",)
    doc = "dgrad: per filter tap, dy times the tap's weights added into strided dx views"

    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        dyn = dy_nhwc(inputs["dy"], g)
        wt = weights_rsck(inputs["w"], g)
        dxp = zero_dx(g)

        def term(dy_part: np.ndarray, r: int, s: int) -> np.ndarray:
            wrs = wt[r, s]  # (Cg, K)
            if g.groups == 1:
                return dy_part @ wrs.T
            if g.cg == 1 and g.kg == 1:
                return dy_part * wrs[0]
            d = dy_part.reshape(*dy_part.shape[:3], g.groups, g.kg)
            return np.einsum("npqgk,cgk->npqgc", d, wrs.reshape(g.cg, g.groups, g.kg),
                             optimize=True)

        for n0, n1 in ranges:
            add_taps(dxp[n0:n1], g, functools.partial(term, dyn[n0:n1]))
        store_dx(dxp, g, outputs["dx"])


@register_variant
class NumpyWgradIm2col(ChunkedIm2col):
    """wgrad: patch matrix, then per group dy^T @ col (BLAS reduces over N*P*Q)."""

    name = "wgrad_im2col_gemm"
    passes = ("wgrad",)
    doc = "wgrad: patch matrix (N*P*Q, R*S*C/g), GEMM dy^T @ col per group; db fused"

    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        xp = padded_nhwc(inputs["x"], g)
        dyn = dy_nhwc(inputs["dy"], g)
        acc = np.zeros((g.groups, g.kg, g.r * g.s * g.cg), np.float32)
        for n0, n1 in ranges:
            cols = patches(xp, g, n0, n1).transpose(0, 2, 1, 3)
            cols = cols.reshape(cols.shape[0], -1)  # (rows, G*RS*Cg)
            acc += _grouped(dyn[n0:n1].reshape(-1, g.k), cols, g, a_t=True)
        # (G, Kg, R, S, Cg) -> (R, S, Cg, K)
        dw = acc.reshape(g.groups, g.kg, g.r, g.s, g.cg).transpose(2, 3, 4, 0, 1)
        store_dw(dw.reshape(g.r, g.s, g.cg, g.k), g, outputs["dw"])
        store_db(dyn, outputs)


@register_variant
class NumpyWgradDirect(TapOrder):
    """wgrad tap by tap: dw[r, s] = (strided input view)^T @ dy, no patch matrix."""

    name = "wgrad_direct"
    passes = ("wgrad",)
    doc = "wgrad: per filter tap, the strided input view times dy summed over N*P*Q; db fused"
    params = {"order": ("tap",)}

    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        xp = padded_nhwc(inputs["x"], g)
        dyn = dy_nhwc(inputs["dy"], g)
        d2 = dyn.reshape(-1, g.k)
        dw = np.empty((g.r, g.s, g.cg, g.k), np.float32)
        for r in range(g.r):
            for s in range(g.s):
                v2 = tap(xp, g, r, s).reshape(-1, g.c)
                if g.groups == 1:
                    dw[r, s] = v2.T @ d2
                elif g.cg == 1 and g.kg == 1:
                    dw[r, s, 0] = np.einsum("mc,mc->c", v2, d2)
                else:
                    prod = _grouped(v2, d2, g, a_t=True)  # (G, Cg, Kg)
                    dw[r, s] = prod.transpose(1, 0, 2).reshape(g.cg, g.k)
        store_dw(dw, g, outputs["dw"])
        store_db(dyn, outputs)
