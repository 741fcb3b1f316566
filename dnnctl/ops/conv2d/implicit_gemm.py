"""conv2d ``implicit_gemm``: the convolution as a tiled GEMM whose patch matrix is gathered
on the fly (kernels/conv2d/implicit_gemm.cu), on tensor cores.

fp16 / bf16 run mma.sync m16n8k16; float32 runs TF32 mma when the key allows tf32, else
exact fp32 FFMA. NHWC gathers up to 16 bytes of channels per copy (cp.async, zero-filled for
padding and tails); NCHW gathers element by element. Any stride, padding (asymmetric too),
dilation and group count except depthwise; split-K with a deterministic two-pass reduction.
An odd channel count per group in fp16 / bf16 NHWC (C = 3 first layers, C = 13) would gather
single 2-byte elements, which cp.async cannot copy: input and weight are then zero-padded to
a multiple of 4 channels in the workspace first (kernels/conv2d/implicit_gemm_pad.cu), so the
gather copies 8 or 16 bytes at a time (the extra channels add exact zeros).
Fused epilogue: + bias, activation, + residual. Parameters as the matmul ``mma`` variant:
block tile bm x bn x bk, warps, pipeline stages, splitk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, np_dtype, unsupported
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, Workspace
from dnnctl.ops.conv2d.implicit_gemm_wgmma import padded_channels
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.conv2d.tiled import TiledConv
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    DTYPE_CODES,
    ELEM_BYTES,
    MAX_GRID_Z,
    OUT_PARTIAL,
    OUT_STORE,
    aligned,
    array_dtype,
    finish_kernel,
    finish_launch,
    load_kernel,
    ptr,
    split_plan,
    vec_for,
)
from dnnctl.ops.matmul.op import ACT_CODES
from dnnctl.ops.registry import register_variant


def _cgp(g: ConvGeom) -> int:
    """Channels per group the NHWC gather sees: padded when they are odd 16-bit ones."""
    if g.nhwc and g.dtype != "float32" and g.cg % 2:
        return padded_channels(g.cg)
    return g.cg


def _kgemm(g: ConvGeom) -> int:
    return _cgp(g) * g.r * g.s


def _splits(g: ConvGeom, bk: int, splitk: int) -> tuple[int, int]:
    kchunk, splits = split_plan(_kgemm(g), bk, splitk)
    return (kchunk, splits) if splits > 1 else (_kgemm(g), 1)


def _pad_workspace(g: ConvGeom, splits: int) -> Workspace:
    """Padded input and weight, then the split-K slabs (when the channels are padded)."""
    cgp, dt = _cgp(g), np_dtype(g.dtype)
    pieces: list[tuple[str, int, Any]] = [("x", g.n * g.h * g.w * g.groups * cgp, dt),
                                          ("w", g.k * g.r * g.s * cgp, dt)]
    if splits > 1:
        pieces.append(("ws", splits * g.groups * g.npq * g.kg, np.float32))
    return Workspace(pieces)


@register_variant
class ImplicitGemm(TiledConv):
    """Implicit-GEMM convolution on tensor cores with a fused epilogue."""

    name = "implicit_gemm"
    source = "conv2d/implicit_gemm.cu"
    doc = ("implicit GEMM (patches gathered on the fly), mma.sync tensor cores / tf32 / fp32 "
           "FFMA, cp.async pipeline, fused bias+act+residual, split-K")
    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        no = self.device_unsupported(device)
        if no is not None:
            return no
        if g.groups > 1 and g.depthwise:
            return unsupported("depthwise: one channel per group makes each GEMM "
                               f"{g.crs} deep, mostly tile padding; use the depthwise variant")
        if g.groups > MAX_GRID_Z:
            return unsupported(f"{g.groups} groups exceed the grid limit {MAX_GRID_Z}")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        math_kind = self._math(g)
        if not self.space_ok(params, math_kind, g.dtype, g.npq, g.kg, _kgemm(g), g.groups,
                             device, False):
            return False
        threads = params["warps"] * 32
        if not g.nhwc:  # one output pixel per thread column of the gather
            return threads % params["bm"] == 0 and params["bk"] % (threads // params["bm"]) == 0
        return True

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        params = self.heuristic(self._math(g), g.npq, g.kg, _kgemm(g), g.groups, device,
                                False)
        if not g.nhwc:
            params["bm"] = min(params["bm"], 128)
        if self.check_params(params) is None and self.valid_params(problem, params, device):
            return params
        return next(iter(self.param_space(problem, device)), None)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        _, splits = _splits(g, params["bk"], params["splitk"])
        if _cgp(g) != g.cg:
            return _pad_workspace(g, splits).nbytes
        return 0 if splits == 1 else 4 * splits * g.groups * g.npq * g.kg

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = self.tile(g, params, device)
        kchunk, splits = _splits(g, cfg.bk, params["splitk"])
        eb = ELEM_BYTES[g.dtype]
        cgp = _cgp(g)
        vec_a = vec_for(cgp, eb) if g.nhwc else 1
        vec_b = vec_for(_kgemm(g), eb)
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
        dims = main_run.consts(*(i32(v) for v in (g.n, g.groups * cgp, g.h, g.w, g.k, g.r,
                                                  g.s, g.p, g.q, g.sh, g.sw, g.pt, g.pl, g.dh,
                                                  g.dw, g.groups, splits, kchunk)))
        ws_elems = splits * g.groups * g.npq * g.kg if fin is not None else 0
        pq = g.p * g.q
        fin_go = None if fin is None else finish_launch(
            fin, m=g.npq, n=g.kg, batch=g.groups, splits=splits, ldc=g.k,
            sc=g.kg if g.nhwc else g.kg * pq, s_bias=g.kg, pq=pq, img_stride=g.k * pq,
            sm_count=device.sm_count or 132)
        xp = get_backend("cupy").xp
        pad = None
        if cgp != g.cg:  # odd 16-bit channels: zero-pad input and weight first
            pad = load_kernel("conv2d/implicit_gemm_pad.cu", "pad_channels",
                              {"DNNCTL_DTYPE": DTYPE_CODES[g.dtype]}, 0)
            work = _pad_workspace(g, splits)
            sms = device.sm_count or 132
            x_rows, w_rows = g.n * g.h * g.w, g.k * g.r * g.s
            pad_x = ((max(1, min(-(-x_rows * g.groups // 256), sms * 16)), 1, 1), (256, 1, 1),
                     (np.int64(x_rows), i32(g.groups), i32(g.cg), i32(cgp)))
            pad_w = ((max(1, min(-(-w_rows // 256), sms * 16)), 1, 1), (256, 1, 1),
                     (np.int64(w_rows), i32(1), i32(g.cg), i32(cgp)))
            pad_x_run = mc.Launch(pad, pad_x[0], pad_x[1])
            pad_w_run = mc.Launch(pad, pad_w[0], pad_w[1])

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            if pad is not None:
                buf = work.allocate(xp)
                x, w, ws = buf["x"], buf["w"], buf.get("ws")
                pad_x_run((inputs["x"], x, *pad_x[2]))
                pad_w_run((inputs["w"], w, *pad_w[2]))
            else:
                x = aligned(inputs["x"], vec_a * eb)
                w = aligned(inputs["w"], vec_b * eb)
                ws = cuda.workspace((ws_elems,), np.float32) if fin is not None else None
            y = outputs["y"]
            y_out = y if ptr(y) % (2 * eb) == 0 else cuda.workspace(tuple(y.shape), array_dtype(y))
            res = aligned(inputs.get("residual"), 2 * eb)
            bias = inputs.get("bias")
            main_run((x, w, y_out, bias, res, ws, *dims))
            if fin_go is not None:
                fin_go(ws, y_out, bias, res)
            if y_out is not y:
                cuda.copy(y, y_out)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel
