"""conv2d ``gemm_1x1``: 1x1 convolutions as one GEMM on our tiled tensor-core kernel.

Stride 1 needs no index math at all and runs kernels/gemm/gemm.cu directly:
NHWC is ``Y (NHW x K) = X (NHW x C) @ W^T`` (a batch of strided GEMMs over the groups),
NCHW is ``Y_n (K x HW) = W (K x C) @ X_n (C x HW)`` for every image (bias per row).
Strided 1x1 convolutions (the ResNet downsampling projections) run
kernels/conv2d/gemm_1x1.cu, the same GEMM core with the pixel rows (NHWC) or columns
(NCHW) found by index math. Unpadded only; NCHW with groups > 1 is left to implicit_gemm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d._cuda import ACT_CODE, res_mode
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.conv2d.tiled import TiledConv, epilogue_defines, run_fused, split_k, tile_defines
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    BIAS_ROW,
    ELEM_BYTES,
    MAX_GRID_Z,
    OUT_PARTIAL,
    OUT_STORE,
    GemmDesc,
    TileConfig,
    aligned,
    finish_kernel,
    finish_launch,
    load_kernel,
    make_gemm,
    split_plan,
    vec_for,
)
from dnnctl.ops.registry import register_variant


def gemm_dims(g: ConvGeom) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of the GEMM a 1x1 convolution is."""
    if g.nhwc:
        return g.npq, g.kg, g.cg, g.groups
    return g.k, g.p * g.q, g.c, g.n


def gemm_desc(g: ConvGeom) -> GemmDesc:
    """The stride-1 problem as a strided-batched GEMM (see the module docstring)."""
    act = ACT_CODE[g.activation]
    if g.nhwc:
        return GemmDesc(
            dtype=g.dtype, m=g.npq, n=g.kg, k=g.cg, batch=g.groups, a_kmajor=True,
            b_kmajor=True, lda=g.c, ldb=g.cg, ldc=g.k, sa=g.cg, sb=g.kg * g.cg, sc=g.kg,
            act=act, bias_mode=BIAS_COL if g.bias else BIAS_NONE, s_bias=g.kg,
            residual=res_mode(g))
    hw = g.h * g.w
    return GemmDesc(
        dtype=g.dtype, m=g.k, n=hw, k=g.c, batch=g.n, a_kmajor=True, b_kmajor=False,
        lda=g.c, ldb=hw, ldc=hw, sa=0, sb=g.c * hw, sc=g.k * hw, act=act,
        bias_mode=BIAS_ROW if g.bias else BIAS_NONE, s_bias=0, residual=res_mode(g))


@register_variant
class Gemm1x1(TiledConv):
    """1x1 convolution as a plain (strided-batched) GEMM with the fused epilogue."""

    name = "gemm_1x1"
    source = "conv2d/gemm_1x1.cu"
    doc = ("1x1 convolution as a GEMM on the tiled tensor-core kernel (stride 1: plain GEMM; "
           "strided: pixel index math), fused bias+act+residual, split-K")
    def geom_unsupported(self, g: ConvGeom, device: Any) -> Support | None:
        if (g.r, g.s) != (1, 1):
            return unsupported(f"only 1x1 filters (this one is {g.r}x{g.s})")
        if (g.pt, g.pb, g.pl, g.pr) != (0, 0, 0, 0):
            return unsupported("padded 1x1 convolution (border outputs see only padding): "
                               "implicit_gemm handles it")
        if g.groups > 1 and g.depthwise:
            return unsupported("depthwise 1x1 is a per-channel scale, not a GEMM; use the "
                               "depthwise variant")
        if not g.nhwc and g.groups > 1:
            return unsupported("NCHW with groups > 1: the (image, group) operands are not one "
                               "strided batch; implicit_gemm handles it")
        if gemm_dims(g)[3] > MAX_GRID_Z:
            return unsupported(f"more than {MAX_GRID_Z} {'groups' if g.nhwc else 'images'} "
                               "(grid limit)")
        return None

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        m, n, k, batch = gemm_dims(g)
        if not self.space_ok(params, self._math(g), g.dtype, m, n, k, batch, device, False):
            return False
        if not g.nhwc and (g.sh, g.sw) != (1, 1):  # one output pixel per gather column
            threads = params["warps"] * 32
            return threads % params["bn"] == 0 and params["bk"] % (threads // params["bn"]) == 0
        return True

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        m, n, k, batch = gemm_dims(g)
        return self.first_valid(
            problem, device, [self.heuristic(self._math(g), m, n, k, batch, device, False)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        m, n, k, batch = gemm_dims(g)
        _, splits = split_plan(k, params["bk"], params["splitk"])
        return 0 if splits <= 1 else 4 * splits * batch * m * n

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = self.tile(g, params, device)
        if (g.sh, g.sw) == (1, 1):
            run = make_gemm(gemm_desc(g), cfg, params["splitk"], False, device)

            def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                       attrs: Mapping[str, Any]) -> None:
                x, w = inputs["x"], inputs["w"]
                a, b = (x, w) if g.nhwc else (w, x)
                run(a, b, outputs["y"], inputs.get("bias"), inputs.get("residual"))

            kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only (make_gemm)
            kernel.replayable = True  # type: ignore[attr-defined]  # launches only
            return kernel
        return _strided(g, cfg, params["splitk"], device)


def _strided(g: ConvGeom, cfg: TileConfig, splitk: int, device: Any) -> Kernel:
    """The strided kernel (kernels/conv2d/gemm_1x1.cu) and its split-K finish."""
    m, n, k, batch = gemm_dims(g)
    kchunk, splits = split_k(k, cfg.bk, splitk)
    eb = ELEM_BYTES[g.dtype]
    vec_a = vec_for(g.cg if g.nhwc else g.c, eb)
    vec_b = vec_for(g.cg, eb) if g.nhwc else 1
    act = ACT_CODE[g.activation]
    bias_mode = (BIAS_COL if g.nhwc else BIAS_ROW) if g.bias else BIAS_NONE
    out_mode = OUT_PARTIAL if splits > 1 else OUT_STORE
    pq = g.p * g.q
    ldc, sc, s_bias = (g.k, g.kg, g.kg) if g.nhwc else (pq, g.k * pq, 0)
    pair = n % 2 == 0 if out_mode == OUT_PARTIAL else ldc % 2 == 0 and (batch == 1 or
                                                                        sc % 2 == 0)
    defines = {**tile_defines(cfg, vec_a, vec_b), "CONV_NHWC": int(g.nhwc),
               **epilogue_defines(g, out_mode, pair, act, bias_mode)}
    smem = cfg.smem_bytes(g.dtype)
    main = load_kernel("conv2d/gemm_1x1.cu", "conv_gemm_1x1", defines, smem)
    fin = finish_kernel(g.dtype, act, bias_mode, res_mode(g), 0) if splits > 1 else None
    grid = (-(-m // cfg.bm) * -(-n // cfg.bn), 1, batch * splits)
    # launches with geometry and scalar arguments fixed here: a call passes pointers
    main_run = mc.Launch(main, grid, (cfg.threads, 1, 1), smem)
    dims = main_run.consts(*(np.int32(v) for v in (g.n, g.c, g.h, g.w, g.k, g.p, g.q, g.sh,
                                                   g.sw, g.groups, splits, kchunk)))
    fin_go = None if fin is None else finish_launch(
        fin, m=m, n=n, batch=batch, splits=splits, ldc=ldc, sc=sc, s_bias=s_bias,
        sm_count=device.sm_count or 132)
    ws_elems = splits * batch * m * n if fin is not None else 0
    va_bytes, vb_bytes = (vec_a * eb, vec_b * eb) if g.nhwc else (vec_b * eb, vec_a * eb)

    def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
               attrs: Mapping[str, Any]) -> None:
        ws = cuda.workspace((ws_elems,), np.float32) if fin is not None else None
        run_fused(main_run, fin_go, eb, aligned(inputs["x"], va_bytes),
                  aligned(inputs["w"], vb_bytes), inputs, outputs["y"], ws, dims)

    kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
    kernel.replayable = True  # type: ignore[attr-defined]  # launches only (see replay)
    return kernel
