"""conv2d ``implicit_gemm``: the convolution as a tiled GEMM whose patch matrix is gathered
on the fly (kernels/conv2d/implicit_gemm.cu), on tensor cores.

fp16 / bf16 run mma.sync m16n8k16; float32 runs TF32 mma when the key allows tf32, else
exact fp32 FFMA. NHWC gathers up to 16 bytes of channels per copy (cp.async, zero-filled for
padding and tails); NCHW gathers element by element. Any stride, padding (asymmetric too),
dilation and group count except depthwise; split-K with a deterministic two-pass reduction.
Fused epilogue: + bias, activation, + residual. Parameters as the matmul ``mma`` variant:
block tile bm x bn x bk, warps, pipeline stages, splitk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends.base import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.matmul.cupy_variants import TiledGemmParams
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    DTYPE_CODES,
    ELEM_BYTES,
    MAX_GRID_Z,
    OUT_PARTIAL,
    OUT_STORE,
    aligned,
    finish_kernel,
    finish_launch,
    load_kernel,
    math_for,
    ptr,
    split_plan,
    tile_config,
    tile_ok,
    vec_for,
)
from dnnctl.ops.matmul.op import ACT_CODES
from dnnctl.ops.registry import register_variant


def _splits(g: ConvGeom, bk: int, splitk: int) -> tuple[int, int]:
    kchunk, splits = split_plan(g.crs, bk, splitk)
    return (kchunk, splits) if splits > 1 else (g.crs, 1)


@register_variant
class ImplicitGemm(TiledGemmParams, CudaConv):
    """Implicit-GEMM convolution on tensor cores with a fused epilogue."""

    name = "implicit_gemm"
    source = "conv2d/implicit_gemm.cu"
    doc = ("implicit GEMM (patches gathered on the fly), mma.sync tensor cores / tf32 / fp32 "
           "FFMA, cp.async pipeline, fused bias+act+residual, split-K")
    params = {"bm": (16, 32, 64, 128, 256), "bn": (32, 64, 128, 256), "bk": (32, 64),
              "warps": (4, 8), "stages": (2, 3, 4, 5), "splitk": (1, 2, 4, 8, 16)}

    @staticmethod
    def _math(g: ConvGeom) -> int:
        return math_for(g.dtype, g.tf32)

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if device.cc_tuple < (8, 0):
            return unsupported(f"needs compute capability >= 8.0 (cp.async, mma); "
                               f"{device.name} is {device.compute_capability}")
        if g.groups > 1 and g.depthwise:
            return unsupported("depthwise: one channel per group makes each GEMM "
                               f"{g.crs} deep, mostly tile padding; use the depthwise variant")
        if g.groups > MAX_GRID_Z:
            return unsupported(f"{g.groups} groups exceed the grid limit {MAX_GRID_Z}")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        math_kind = self._math(g)
        if not self.space_ok(params, math_kind, g.dtype, g.npq, g.kg, g.crs, g.groups,
                             device, False):
            return False
        threads = params["warps"] * 32
        if not g.nhwc:  # one output pixel per thread column of the gather
            return threads % params["bm"] == 0 and params["bk"] % (threads // params["bm"]) == 0
        return True

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        params = self.heuristic(self._math(g), g.npq, g.kg, g.crs, g.groups, device, False)
        if not g.nhwc:
            params["bm"] = min(params["bm"], 128)
        if self.check_params(params) is None and self.valid_params(problem, params, device):
            return params
        return next(iter(self.param_space(problem, device)), None)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        _, splits = _splits(g, params["bk"], params["splitk"])
        return 0 if splits == 1 else 4 * splits * g.groups * g.npq * g.kg

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = tile_config(params, self._math(g))
        if cfg is None or not tile_ok(cfg, g.dtype, device):
            raise UnsupportedError(f"conv2d/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        kchunk, splits = _splits(g, cfg.bk, params["splitk"])
        eb = ELEM_BYTES[g.dtype]
        vec_a = vec_for(g.cg, eb) if g.nhwc else 1
        vec_b = vec_for(g.crs, eb)
        act = ACT_CODES[g.activation]
        bias_mode = BIAS_COL if g.bias else BIAS_NONE
        out_mode = OUT_PARTIAL if splits > 1 else OUT_STORE
        pair = g.kg % 2 == 0 if out_mode == OUT_PARTIAL else g.nhwc and g.k % 2 == 0 and (
            g.groups == 1 or g.kg % 2 == 0)
        defines = {
            "DNNCTL_DTYPE": DTYPE_CODES[g.dtype], "GEMM_MATH": cfg.math, "GEMM_BM": cfg.bm,
            "GEMM_BN": cfg.bn, "GEMM_BK": cfg.bk, "GEMM_WM": cfg.wm, "GEMM_WN": cfg.wn,
            "GEMM_STAGES": cfg.stages, "CONV_NHWC": int(g.nhwc), "GEMM_VEC_A": vec_a,
            "GEMM_VEC_B": vec_b, "EPI_OUT": out_mode, "EPI_PAIR": int(pair),
            "EPI_ACT": act if out_mode == OUT_STORE else 0,
            "EPI_BIAS": bias_mode if out_mode == OUT_STORE else BIAS_NONE,
            "EPI_RES": int(g.residual and out_mode == OUT_STORE),
        }
        smem = cfg.smem_bytes(g.dtype)
        main = load_kernel(self.source, "conv_implicit_gemm", defines, smem)
        fin = finish_kernel(g.dtype, act, bias_mode, g.residual, 0 if g.nhwc else 1) \
            if splits > 1 else None
        tiles = -(-g.npq // cfg.bm) * -(-g.kg // cfg.bn)
        grid = (tiles, 1, g.groups * splits)
        block = (cfg.threads, 1, 1)
        i32 = np.int32
        # launches with geometry and scalar arguments fixed here: a call passes pointers
        main_run = mc.Launch(main, grid, block, smem)
        dims = main_run.consts(*(i32(v) for v in (g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.p, g.q,
                                                  g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.groups,
                                                  splits, kchunk)))
        ws_elems = splits * g.groups * g.npq * g.kg if fin is not None else 0
        pq = g.p * g.q
        fin_go = None if fin is None else finish_launch(
            fin, m=g.npq, n=g.kg, batch=g.groups, splits=splits, ldc=g.k,
            sc=g.kg if g.nhwc else g.kg * pq, s_bias=g.kg, pq=pq, img_stride=g.k * pq,
            sm_count=device.sm_count or 132)
        xp = get_backend("cupy").xp

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x = aligned(inputs["x"], vec_a * eb, xp)
            w = aligned(inputs["w"], vec_b * eb, xp)
            y = outputs["y"]
            y_out = y if ptr(y) % (2 * eb) == 0 else xp.empty(y.shape, dtype=y.dtype)
            res = aligned(inputs.get("residual"), 2 * eb, xp)
            bias = inputs.get("bias")
            ws = xp.empty((ws_elems,), dtype=np.float32) if fin is not None else None
            main_run((x, w, y_out, bias, res, ws, *dims))
            if fin_go is not None:
                fin_go(ws, y_out, bias, res)
            if y_out is not y:
                y[...] = y_out

        return kernel
