"""conv2d ``im2col_gemm``: explicit patch matrix (kernels/conv2d/im2col.cu) + cuBLAS GEMM.

NHWC: per chunk of images one strided-batched GEMM over the groups,
  y[n*P*Q, g*Kg:(g+1)*Kg] = col_g[n*P*Q, R*S*Cg] @ w_g[Kg, R*S*Cg]^T  (written in place in y).
NCHW: per group one strided-batched GEMM over the images of the chunk,
  y[n, g*Kg:(g+1)*Kg, P*Q] = w_g[Kg, Cg*R*S] @ col_{n,g}[Cg*R*S, P*Q].
cuBLAS writes the output dtype with fp32 accumulation (TF32 only when the key says tf32); the
epilogue (bias, activation, residual) then runs in place. A 1x1 / stride 1 / unpadded
convolution needs no patch matrix: the GEMM reads x directly and the workspace is 0.
Parameters: ``chunk`` images per pass (0: the whole batch) bounds the workspace; ``vec``
channels per im2col access (NHWC).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import (
    SUPPORTED,
    CudaConv,
    Epilogue,
    Workspace,
    batch_chunk,
    image_chunks,
    io_dtype,
)
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

DEFAULT_WS_LIMIT = 1 << 30  # default_params keeps the patch matrix under 1 GiB


def col_elems(g: ConvGeom, chunk: int) -> int:
    """Elements of the patch (column) matrix of ``chunk`` images; 0 when x is its own."""
    return 0 if g.identity else batch_chunk(g, chunk) * g.p * g.q * g.c * g.r * g.s


def col_geo(g: ConvGeom) -> tuple[np.int32, ...]:
    """The geometry arguments of the im2col.cu / col2im.cu kernels."""
    return _cuda.i32(g.c, g.h, g.w, g.p, g.q, g.r, g.s, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw,
                     g.groups)


_LAUNCHES: dict[tuple[Any, tuple[int, int, int]], cuda.Launch] = {}


def im2col(fn: Any, g: ConvGeom, x: Any, col: Any, n0: int, cnt: int, vec: int = 1) -> None:
    """Launch im2col.cu's ``fn`` (built for ``vec`` channels per access in NHWC): the patch
    matrix of images n0:n0+cnt of x into col (any arrays with a device pointer: a torch
    caller's tensors as they are)."""
    pq = g.p * g.q
    if g.nhwc:
        blocks = _cuda.grid1d(g.groups * cnt * pq * (g.cg // vec), 256, 65535)[0]
        grid = (blocks, g.r * g.s, 1)
    else:
        grid = (min(-(-pq // 256), 65535), g.cg * g.r * g.s, cnt * g.groups)
    launch = _LAUNCHES.get((fn, grid))
    if launch is None:
        launch = _LAUNCHES[(fn, grid)] = cuda.Launch(fn, grid, (256, 1, 1))
    launch((x, col, *_cuda.i32(n0, cnt), *col_geo(g)))


@register_variant
class CudaIm2colGemm(CudaConv):
    """Patch matrix in a workspace, then cuBLAS (tensor cores for fp16/bf16/tf32)."""

    name = "im2col_gemm"
    source = "conv2d/im2col.cu"
    doc = "explicit im2col workspace + cuBLAS strided-batched GEMM + in-place epilogue"
    params = {"chunk": (0, 1, 4, 16, 64), "vec": (1, 2, 4, 8)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if not g.nhwc and g.cg * g.r * g.s > 65535:
            return unsupported("NCHW patch rows C/g*R*S above 65535 (grid y limit)")
        if g.r * g.s > 65535:
            return unsupported("filter taps above 65535 (grid y limit)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        chunk, vec = params["chunk"], params["vec"]
        if chunk and chunk >= g.n:
            return False  # same as chunk 0
        if g.identity:
            return chunk == 0 and vec == 1  # no patch matrix: nothing to tune
        if not g.nhwc:
            return vec == 1 and batch_chunk(g, chunk) * g.groups <= 65535
        esize = 4 if g.dtype == "float32" else 2
        return vec * esize <= 16 and g.cg % vec == 0

    def workspace(self, g: ConvGeom, chunk: int) -> Workspace:
        if g.identity:
            return Workspace([])
        return Workspace([("col", col_elems(g, chunk), io_dtype(g))])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        return 0 if g.identity else self.workspace(g, params["chunk"]).nbytes

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        picks = ({"chunk": chunk, "vec": vec} for chunk in (0, 64, 16, 4, 1)
                 for vec in (8, 4, 2, 1))
        return self.first_valid(problem, device, picks, DEFAULT_WS_LIMIT)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        chunks = image_chunks(g, params["chunk"])
        ws = self.workspace(g, params["chunk"])
        identity = g.identity
        vec = params["vec"]
        fns: dict[int, Any] = {}

        def im2col_fn(v: int) -> Any:
            if v not in fns:
                defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc),
                           "VEC": v}
                fns[v] = rt.function(self.source, defines,
                                     "im2col_nhwc" if g.nhwc else "im2col_nchw")
            return fns[v]

        if not identity:
            im2col_fn(vec)
        epi = Epilogue(rt, g) if _cuda.needs_epilogue(g) else None
        pq, crs = g.p * g.q, g.cg * g.r * g.s

        def patches(x: Any, col: Any, n0: int, cnt: int) -> None:
            # a DLPack view of x need not be vector-aligned: then scalar accesses
            v = vec if g.nhwc and rt.ptr(x) % (vec * x.itemsize) == 0 else 1
            im2col(im2col_fn(v), g, x, col, n0, cnt, v)

        def gemm_nhwc(x: Any, w: Any, y: Any, col: Any, n0: int, cnt: int) -> None:
            rows = cnt * pq
            if identity:
                a, a_off, lda, sa = x, n0 * pq * g.c, g.c, g.cg
            else:
                a, a_off, lda, sa = col, 0, crs, rows * crs
            _cuda.gemm_rowmajor(rt, rows, g.kg, crs, a, a_off, lda, sa, False,
                                w, 0, crs, g.kg * crs, True,
                                y, n0 * pq * g.k, g.k, g.kg, batch=g.groups, tf32=g.tf32)

        def gemm_nchw(x: Any, w: Any, y: Any, col: Any, n0: int, cnt: int) -> None:
            for grp in range(g.groups):
                if identity:
                    b, b_off, sb = x, (n0 * g.c + grp * g.cg) * pq, g.c * pq
                else:
                    b, b_off, sb = col, grp * crs * pq, g.groups * crs * pq
                _cuda.gemm_rowmajor(rt, g.kg, pq, crs, w, grp * g.kg * crs, crs, 0, False,
                                    b, b_off, pq, sb, False,
                                    y, (n0 * g.k + grp * g.kg) * pq, pq, g.k * pq,
                                    batch=cnt, tf32=g.tf32)

        gemm = gemm_nhwc if g.nhwc else gemm_nchw

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, w, y = inputs["x"], inputs["w"], outputs["y"]
            col = None if identity else ws.allocate(rt.xp)["col"]
            for n0, cnt in chunks:
                if not identity:
                    patches(x, col, n0, cnt)
                gemm(x, w, y, col, n0, cnt)
            if epi is not None:
                epi(y, inputs)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers (and dtypes) only
        return kernel
