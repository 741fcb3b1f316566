"""conv2d ``winograd``: F(2x2, 3x3) and F(4x4, 3x3) for 3x3, stride 1, dilation 1, groups 1
(kernels/conv2d/winograd.cu + cuBLAS strided-batched GEMM over the alpha^2 positions).

Accuracy rule (measured by simulation against the float64 reference): F(2x2) keeps U and V in
the I/O dtype (fp16/bf16 GEMM on tensor cores, fp32 accumulate; fp32 problems use fp32, or
TF32 when the key allows it); F(4x4) amplifies rounding of U and V by its larger transform
coefficients (fp16 U/V: ~3e-3, bf16: ~2.5e-2 relative), so it always keeps U and V in fp32
and runs an fp32 GEMM without TF32. With TF32, F(2x2) stores U and V rounded to TF32 (nearest)
so the GEMM's own conversion is exact: ~5e-4 (truncating them would give ~9e-4). The GEMM result M is fp32; the output transform applies
the epilogue. Parameters: ``tile`` (2 or 4), ``chunk`` images per pass (0: the whole batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import (
    SUPPORTED,
    CudaConv,
    Workspace,
    batch_chunk,
    image_chunks,
    io_dtype,
)
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

DEFAULT_WS_LIMIT = 1 << 30


def uv_fp32(g: ConvGeom, tile: int) -> bool:
    return tile == 4 or g.dtype == "float32"


@register_variant
class CudaWinograd(CudaConv):
    """Winograd minimal filtering: 2.25x (F2) or 4x (F4) fewer multiplies than direct."""

    name = "winograd"
    source = "conv2d/winograd.cu"
    doc = "F(2x2,3x3) / F(4x4,3x3): fp32 transforms, cuBLAS batched GEMM, fused epilogue"
    params = {"tile": (2, 4), "chunk": (0, 1, 4, 16, 64)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if (g.r, g.s) != (3, 3):
            return unsupported(f"winograd F(m,3x3) needs a 3x3 filter, got {g.r}x{g.s}")
        if (g.sh, g.sw) != (1, 1) or (g.dh, g.dw) != (1, 1):
            return unsupported("winograd needs stride 1 and dilation 1")
        if g.groups != 1:
            return unsupported("winograd is implemented for groups == 1")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        chunk = params["chunk"]
        return chunk == 0 or chunk < problem["n"]

    def tiles(self, g: ConvGeom, tile: int) -> tuple[int, int]:
        return -(-g.p // tile), -(-g.q // tile)

    def workspace(self, g: ConvGeom, params: Mapping[str, Any]) -> Workspace:
        tile = params["tile"]
        alpha2 = (tile + 2) ** 2
        th, tw = self.tiles(g, tile)
        t = batch_chunk(g, params["chunk"]) * th * tw
        uv = np.dtype(np.float32) if uv_fp32(g, tile) else io_dtype(g)
        return Workspace([("U", alpha2 * g.k * g.c, uv), ("V", alpha2 * t * g.c, uv),
                          ("M", alpha2 * t * g.k, np.float32)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return self.workspace(geometry(problem), params).nbytes

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        # F4 runs an fp32 GEMM (4x fewer multiplies); F2 keeps tensor cores for fp16 / bf16 /
        # tf32 GEMMs, which outrun fp32 CUDA cores by far more than 1.8x
        strict_fp32 = g.dtype == "float32" and not g.tf32
        tile = 4 if strict_fp32 and g.p >= 8 and g.q >= 8 else 2
        picks = ({"tile": tile, "chunk": chunk} for chunk in (0, 64, 16, 4, 1))
        return self.first_valid(problem, device, picks, DEFAULT_WS_LIMIT)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        tile = params["tile"]
        alpha2 = (tile + 2) ** 2
        fp32_uv = uv_fp32(g, tile)
        tf32 = g.tf32 and tile == 2  # F4 never rounds U/V to TF32 (see module docstring)
        defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc),
                   "TILE": tile, "UV_FP32": int(fp32_uv), "TF32_RN": int(tf32)}
        f_filter = rt.function(self.source, defines, "wino_filter")
        f_input = rt.function(self.source, defines, "wino_input")
        f_output = rt.function(self.source, defines, "wino_output")
        ws = self.workspace(g, params)
        th, tw = self.tiles(g, tile)
        chunks = image_chunks(g, params["chunk"])
        block = (256, 1, 1)

        def gemm(U: Any, V: Any, M: Any, t: int) -> None:
            if g.nhwc:  # M[a][t][k] = V[a][t][:] . U[a][k][:]
                _cuda.gemm_rowmajor(rt, t, g.k, g.c, V, 0, g.c, t * g.c, False,
                                    U, 0, g.c, g.k * g.c, True, M, 0, g.k, t * g.k,
                                    batch=alpha2, tf32=tf32)
            else:  # M[a][k][t] = U[a][k][:] . V[a][:][t]
                _cuda.gemm_rowmajor(rt, g.k, t, g.c, U, 0, g.c, g.k * g.c, False,
                                    V, 0, t, g.c * t, False, M, 0, t, g.k * t,
                                    batch=alpha2, tf32=tf32)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            buf = ws.allocate(rt.xp)
            U, V, M = buf["U"], buf["V"], buf["M"]
            f_filter(_cuda.grid1d(g.k * g.c, 256), block,
                     (inputs["w"], U, *_cuda.i32(g.k, g.c)))
            bias, res, act, flags = _cuda.epilogue_args(g, y, inputs)
            for n0, cnt in chunks:
                t = cnt * th * tw
                f_input(_cuda.grid1d(t * g.c, 256), block,
                        (x, V, *_cuda.i32(n0, cnt, g.c, g.h, g.w, g.pt, g.pl, th, tw)))
                gemm(U, V, M, t)
                f_output(_cuda.grid1d(t * g.k, 256), block,
                         (M, y, bias, res, *_cuda.i32(n0, cnt, g.k, g.p, g.q, th, tw), act,
                          flags))

        return kernel
