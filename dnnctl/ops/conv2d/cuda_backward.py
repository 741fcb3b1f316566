"""conv2d dgrad / wgrad on CUDA: cuBLAS over explicit columns, direct and depthwise kernels.

* ``dgrad_im2col_gemm`` — per group one strided-batched cuBLAS GEMM dy @ w into a column
  matrix (kernels/conv2d/col2im.cu's layout = im2col.cu's), then col2im gathers each dx
  element from the taps on its stride phase (deterministic). 1x1 / stride 1 / unpadded: the
  GEMM writes dx directly.
* ``wgrad_im2col_gemm`` — the forward's im2col, then dw += dy^T @ col by cuBLAS in a float32
  accumulator (the reduction over N*P*Q is cuBLAS's; chunks of images add with beta 1), then
  one pass to dw's dtype; db by the deterministic column-sum kernels (bias_grad.cu).
* ``dgrad_direct`` / ``wgrad_direct`` (kernels/conv2d/direct_bwd.cu) — CUDA cores, any
  groups; wgrad splits N*P*Q over ``splits`` blocks with a fixed-order reduction
  (deterministic, workspace splits * |w| floats).
* ``dgrad_depthwise`` / ``wgrad_depthwise`` — the same kernels compiled for C/g == 1
  (the channel multiplier is the only channel loop; wgrad lanes walk channels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, Workspace, image_chunks, io_dtype
from dnnctl.ops.conv2d.im2col_gemm import (
    DEFAULT_WS_LIMIT,
    col_elems,
    col_geo,
    im2col,
)
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant


def geo_args(g: ConvGeom) -> tuple[np.int32, ...]:
    return _cuda.i32(g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.p, g.q, g.sh, g.sw, g.pt, g.pl,
                     g.dh, g.dw, g.groups)


class BiasGrad:
    """db[k] = sum of dy over N*P*Q, in two deterministic launches (bias_grad.cu)."""

    def __init__(self, rt: Any, g: ConvGeom):
        code = _cuda.DTYPE_CODE[g.dtype]
        self.part = rt.function("conv2d/bias_grad.cu", {"DNNCTL_DTYPE": code, "GRAD_ACT": 0},
                                "grad_colsum_partial")
        self.fin = rt.function("conv2d/bias_grad.cu", {"DNNCTL_DTYPE": code, "GRAD_ACT": 0},
                               "grad_colsum_finish")
        pq = g.p * g.q
        self.m, self.k = g.npq, g.k
        per, self.chunks = _cuda.colsum_split(self.m, self.k)
        strides = (pq * g.k, 1, g.k) if g.nhwc else (g.k * pq, pq, 1)
        self.args = (np.int64(self.m), *_cuda.i32(g.k, pq), *(np.int64(v) for v in strides),
                     np.int64(per))

    def __call__(self, dy: Any, db: Any, partial: Any) -> None:
        self.part((-(-self.k // 32), self.chunks, 1), (32, 8, 1),
                  (dy, dy, dy, partial, *self.args))
        self.fin(_cuda.grid1d(self.k, 256), (256, 1, 1),
                 (partial, db, *_cuda.i32(self.k, self.chunks)))


def wgrad_workspace(g: ConvGeom, *pieces: tuple[str, int, Any]) -> Workspace:
    """A wgrad variant's ``pieces``, then BiasGrad's partial sums when the key asks for db."""
    out = list(pieces)
    if g.bias:
        out.append(("db_partial", _cuda.colsum_split(g.npq, g.k)[1] * g.k, np.float32))
    return Workspace(out)


def bias_grad(rt: Any, g: ConvGeom) -> Any:
    """``db(inputs, outputs, buf)``: db = dy summed over N*P*Q (BiasGrad, its partials in
    ``buf``, a :func:`wgrad_workspace`) when the key asks for it, else nothing."""
    if not g.bias:
        return lambda inputs, outputs, buf: None
    grad = BiasGrad(rt, g)
    return lambda inputs, outputs, buf: grad(inputs["dy"], outputs["db"], buf["db_partial"])


class _CudaBackward(CudaConv):
    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        return SUPPORTED


# ----------------------------------------------------------------------------- im2col + cuBLAS


class _ColumnGemm(_CudaBackward):
    params = {"chunk": (0, 1, 4, 16, 64)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if g.depthwise and g.groups > 1:
            return unsupported("depthwise: per-group GEMMs of one channel; use the depthwise "
                               "variant")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        return not (params["chunk"] and params["chunk"] >= g.n)


    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        for chunk in (0, 64, 16, 4, 1):
            p = {"chunk": chunk}
            if (self.valid_params(problem, p, device)
                    and self.workspace_bytes(problem, p) <= DEFAULT_WS_LIMIT):
                return p
        return {"chunk": 1}

    def workspace(self, g: ConvGeom, chunk: int) -> Workspace:
        raise NotImplementedError

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        return self.chunked(g, _cuda.runtime(), image_chunks(g, params["chunk"]),
                            self.workspace(g, params["chunk"]))

    def chunked(self, g: ConvGeom, rt: Any, chunks: list[tuple[int, int]],
                ws: Workspace) -> Kernel:
        """The kernel: ``chunks`` of images at a time through the ``ws`` columns."""
        raise NotImplementedError


@register_variant
class CudaDgradIm2col(_ColumnGemm):
    """dgrad: cuBLAS dy @ w into columns, then the col2im gather."""

    name = "dgrad_im2col_gemm"
    passes = ("dgrad",)
    source = "conv2d/col2im.cu"
    doc = "dgrad: cuBLAS strided-batched GEMM dy @ w into a column matrix, then col2im"

    def workspace(self, g: ConvGeom, chunk: int) -> Workspace:
        return Workspace([("col", col_elems(g, chunk), io_dtype(g))])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        return 0 if g.identity else self.workspace(g, params["chunk"]).nbytes

    def chunked(self, g: ConvGeom, rt: Any, chunks: list[tuple[int, int]],
                ws: Workspace) -> Kernel:
        ident = g.identity
        fn = None if ident else rt.function(self.source, {
            "DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc)}, "col2im")
        pq, hw, crs = g.p * g.q, g.h * g.w, g.cg * g.r * g.s
        geo = col_geo(g)

        def gemm(dy: Any, w: Any, out: Any, n0: int, cnt: int) -> None:
            if g.nhwc:  # per group: out[rows, crs] = dy_g[rows, Kg] @ w_g[Kg, crs]
                rows = cnt * pq
                c_off, ldc, sc = (n0 * hw * g.c, g.c, g.cg) if ident else (0, crs, rows * crs)
                _cuda.gemm_rowmajor(rt, rows, crs, g.kg, dy, n0 * pq * g.k, g.k, g.kg, False,
                                    w, 0, crs, g.kg * crs, False, out, c_off, ldc, sc,
                                    batch=g.groups, tf32=g.tf32)
                return
            for grp in range(g.groups):  # per image: out[crs, pq] = w_g^T @ dy_{n,g}[Kg, pq]
                if ident:
                    c_off, sc = (n0 * g.c + grp * g.cg) * hw, g.c * hw
                else:
                    c_off, sc = grp * crs * pq, g.groups * crs * pq
                _cuda.gemm_rowmajor(rt, crs, pq, g.kg, w, grp * g.kg * crs, crs, 0, True,
                                    dy, (n0 * g.k + grp * g.kg) * pq, pq, g.k * pq, False,
                                    out, c_off, pq, sc, batch=cnt, tf32=g.tf32)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            dy, w, dx = inputs["dy"], inputs["w"], outputs["dx"]
            col = None if ident else ws.allocate(rt.xp)["col"]
            for n0, cnt in chunks:
                if ident:
                    gemm(dy, w, dx, n0, cnt)
                    continue
                gemm(dy, w, col, n0, cnt)
                fn(_cuda.grid1d(cnt * g.c * hw, 256, 65535 * 8), (256, 1, 1),
                   (col, dx, *_cuda.i32(n0, cnt), *geo))

        return kernel


@register_variant
class CudaWgradIm2col(_ColumnGemm):
    """wgrad: im2col, cuBLAS dy^T @ col into a float32 accumulator, db fused alongside."""

    name = "wgrad_im2col_gemm"
    passes = ("wgrad",)
    source = "conv2d/im2col.cu"
    doc = "wgrad: im2col + cuBLAS dy^T @ col (reduction over N*P*Q), fp32 accumulate; db"

    def workspace(self, g: ConvGeom, chunk: int) -> Workspace:
        return wgrad_workspace(g, ("col", col_elems(g, chunk), io_dtype(g)),
                               ("acc", g.k * g.crs, np.float32))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return self.workspace(geometry(problem), params["chunk"]).nbytes

    def chunked(self, g: ConvGeom, rt: Any, chunks: list[tuple[int, int]],
                ws: Workspace) -> Kernel:
        ident = g.identity
        code = _cuda.DTYPE_CODE[g.dtype]
        patches = None if ident else rt.function(self.source, {
            "DNNCTL_DTYPE": code, "NHWC": int(g.nhwc), "VEC": 1},
            "im2col_nhwc" if g.nhwc else "im2col_nchw")
        finish = rt.function("conv2d/direct_bwd.cu", {"DNNCTL_DTYPE": code, "NHWC": int(
            g.nhwc), "DEPTHWISE": 0}, "wgrad_direct_finish")
        db = bias_grad(rt, g)
        pq, crs = g.p * g.q, g.cg * g.r * g.s

        def gemm(x: Any, dy: Any, col: Any, acc: Any, n0: int, cnt: int, beta: float) -> None:
            if g.nhwc:  # per group: acc_g[Kg, crs] += dy_g^T[Kg, rows] @ col_g[rows, crs]
                rows = cnt * pq
                b, b_off, ldb, sb = ((x, n0 * pq * g.c, g.c, g.cg) if ident
                                     else (col, 0, crs, rows * crs))
                _cuda.gemm_rowmajor(rt, g.kg, crs, rows, dy, n0 * pq * g.k, g.k, g.kg, True,
                                    b, b_off, ldb, sb, False, acc, 0, crs, g.kg * crs,
                                    batch=g.groups, tf32=g.tf32, beta=beta)
                return
            for i in range(cnt):  # per image, batched over groups: acc_g += dy_g @ col_g^T
                b, b_off, sb = ((x, (n0 + i) * g.c * pq, g.cg * pq) if ident
                                else (col, i * g.groups * crs * pq, crs * pq))
                _cuda.gemm_rowmajor(rt, g.kg, crs, pq, dy, (n0 + i) * g.k * pq, pq, g.kg * pq,
                                    False, b, b_off, pq, sb, True, acc, 0, crs, g.kg * crs,
                                    batch=g.groups, tf32=g.tf32,
                                    beta=beta if i == 0 else 1.0)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, dy = inputs["x"], inputs["dy"]
            buf = ws.allocate(rt.xp)
            for n0, cnt in chunks:
                if not ident:
                    im2col(patches, g, x, buf["col"], n0, cnt)
                gemm(x, dy, buf.get("col"), buf["acc"], n0, cnt, 0.0 if n0 == 0 else 1.0)
            finish(_cuda.grid1d(g.k * crs, 256, 65535 * 8), (256, 1, 1),
                   (buf["acc"], outputs["dw"], *geo_args(g), np.int32(1)))
            db(inputs, outputs, buf)

        return kernel


# ----------------------------------------------------------------------------- direct


class _Direct(_CudaBackward):
    source = "conv2d/direct_bwd.cu"
    depthwise_kernel = False

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if self.depthwise_kernel and not g.depthwise:
            return unsupported("not depthwise (groups != C)")
        return SUPPORTED

    def defines(self, g: ConvGeom) -> dict[str, int]:
        return {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc),
                "DEPTHWISE": int(self.depthwise_kernel)}


class _DirectDgrad(_Direct):
    passes = ("dgrad",)
    params = {"threads": (128, 256)}

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        fn = rt.function(self.source, self.defines(g), "dgrad_direct")
        threads = params["threads"]
        grid = _cuda.grid1d(g.n * g.c * g.h * g.w, threads, 65535 * 16)
        geo = geo_args(g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            fn(grid, (threads, 1, 1), (inputs["dy"], inputs["w"], outputs["dx"], *geo))

        return kernel


class _DirectWgrad(_Direct):
    passes = ("wgrad",)
    params = {"splits": (1, 4, 16, 64, 256)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        return params["splits"] == 1 or params["splits"] * 64 <= g.npq

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        g = geometry(problem)
        blocks = -(-g.k * g.crs // 32)
        sms = int(getattr(device, "sm_count", 0) or 132)
        for splits in (256, 64, 16, 4, 1):  # enough blocks for 4 per SM, >= 256 rows each
            if blocks * splits <= 4 * sms and (splits == 1 or g.npq >= splits * 256):
                return {"splits": splits}
        return {"splits": 1}

    def workspace(self, g: ConvGeom, splits: int) -> Workspace:
        return wgrad_workspace(g, ("partial", splits * g.k * g.crs, np.float32))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return self.workspace(geometry(problem), params["splits"]).nbytes

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        part = rt.function(self.source, self.defines(g), "wgrad_direct_partial")
        fin = rt.function(self.source, self.defines(g), "wgrad_direct_finish")
        splits = params["splits"]
        rows = -(-g.npq // splits)
        welems = g.k * g.crs
        ws = self.workspace(g, splits)
        db = bias_grad(rt, g)
        geo = geo_args(g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            buf = ws.allocate(rt.xp)
            part((-(-welems // 32), splits, 1), (32, 8, 1),
                 (inputs["x"], inputs["dy"], buf["partial"], *geo, np.int64(rows)))
            fin(_cuda.grid1d(welems, 256, 65535 * 8), (256, 1, 1),
                (buf["partial"], outputs["dw"], *geo, np.int32(splits)))
            db(inputs, outputs, buf)

        return kernel


@register_variant
class CudaDgradDirect(_DirectDgrad):
    """dgrad on CUDA cores, one thread per dx element, only the taps on its stride phase."""

    name = "dgrad_direct"
    doc = "dgrad: one thread per dx element over K/g channels x the taps on its stride phase"


@register_variant
class CudaDgradDepthwise(_DirectDgrad):
    """dgrad of a depthwise convolution (C/g == 1)."""

    name = "dgrad_depthwise"
    depthwise_kernel = True
    doc = "dgrad, depthwise: per dx element the channel multiplier x the phase's taps"


@register_variant
class CudaWgradDirect(_DirectWgrad):
    """wgrad on CUDA cores with a deterministic split of N*P*Q; db fused alongside."""

    name = "wgrad_direct"
    doc = "wgrad: lanes over weights, rows of N*P*Q split over blocks, fixed-order sum; db"


@register_variant
class CudaWgradDepthwise(_DirectWgrad):
    """wgrad of a depthwise convolution: lanes walk channels (coalesced NHWC reads)."""

    name = "wgrad_depthwise"
    depthwise_kernel = True
    doc = "wgrad, depthwise: lanes over channels per tap, split N*P*Q, fixed-order sum; db"
