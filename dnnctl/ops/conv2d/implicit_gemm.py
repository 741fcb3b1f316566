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
from dnnctl.ops.base import Kernel, Problem, Support
from dnnctl.ops.conv2d import tiled
from dnnctl.ops.conv2d._cuda import ACT_CODE
from dnnctl.ops.conv2d.implicit_gemm_wgmma import padded_channels
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.conv2d.tiled import TiledConv
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    ELEM_BYTES,
    aligned,
    load_kernel,
    vec_for,
)
from dnnctl.ops.registry import register_variant


def _cgp(g: ConvGeom) -> int:
    """Channels per group the NHWC gather sees: padded when they are odd 16-bit ones."""
    if g.nhwc and g.dtype != "float32" and g.cg % 2:
        return padded_channels(g.cg)
    return g.cg


def _kgemm(g: ConvGeom) -> int:
    return _cgp(g) * g.r * g.s


@register_variant
class ImplicitGemm(TiledConv):
    """Implicit-GEMM convolution on tensor cores with a fused epilogue."""

    name = "implicit_gemm"
    source = "conv2d/implicit_gemm.cu"
    doc = ("implicit GEMM (patches gathered on the fly), mma.sync tensor cores / tf32 / fp32 "
           "FFMA, cp.async pipeline, fused bias+act+residual, split-K")
    def geom_unsupported(self, g: ConvGeom, device: Any) -> Support | None:
        return tiled.groups_unsupported(
            g, f"one channel per group makes each GEMM {g.crs} deep, mostly tile padding; "
            "use the depthwise variant")

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
        return self.first_valid(problem, device, [params])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        _, splits = tiled.split_k(_kgemm(g), params["bk"], params["splitk"])
        if _cgp(g) != g.cg:
            return tiled.padded_workspace(g, _cgp(g), splits).nbytes
        return 0 if splits == 1 else 4 * splits * g.groups * g.npq * g.kg

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = self.tile(g, params, device)
        kchunk, splits = tiled.split_k(_kgemm(g), cfg.bk, params["splitk"])
        eb = ELEM_BYTES[g.dtype]
        cgp = _cgp(g)
        vec_a = vec_for(cgp, eb) if g.nhwc else 1
        vec_b = vec_for(_kgemm(g), eb)
        act = ACT_CODE[g.activation]
        bias_mode = BIAS_COL if g.bias else BIAS_NONE
        out_mode, pair = tiled.store_mode(g, splits)
        defines = {**tiled.tile_defines(cfg, vec_a, vec_b), "CONV_NHWC": int(g.nhwc),
                   **tiled.epilogue_defines(g, out_mode, pair, act, bias_mode)}
        smem = cfg.smem_bytes(g.dtype)
        main = load_kernel(self.source, "conv_implicit_gemm", defines, smem)
        tiles = -(-g.npq // cfg.bm) * -(-g.kg // cfg.bn)
        # launches with geometry and scalar arguments fixed here: a call passes pointers
        main_run = mc.Launch(main, (tiles, 1, g.groups * splits), (cfg.threads, 1, 1), smem)
        dims = main_run.consts(*tiled.gather_dims(g, g.groups * cgp, splits, kchunk))
        ws_elems = splits * g.groups * g.npq * g.kg if splits > 1 else 0
        fin_go = tiled.forward_finish(g, splits, act, bias_mode, device.sm_count or 132)
        xp = get_backend("cupy").xp
        pad = None
        if cgp != g.cg:  # odd 16-bit channels: zero-pad input and weight first
            pad = tiled.channel_pad(g, cgp, device.sm_count or 132)
            work = tiled.padded_workspace(g, _cgp(g), splits)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            if pad is not None:
                buf = work.allocate(xp)
                x, w = pad(inputs, buf)
                ws = buf.get("ws")
            else:
                x = aligned(inputs["x"], vec_a * eb)
                w = aligned(inputs["w"], vec_b * eb)
                ws = cuda.workspace((ws_elems,), np.float32) if ws_elems else None
            tiled.run_fused(main_run, fin_go, eb, x, w, inputs, outputs["y"], ws, dims)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.replayable = True  # type: ignore[attr-defined]  # launches only (see replay)
        return kernel
