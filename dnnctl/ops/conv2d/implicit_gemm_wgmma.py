"""conv2d ``implicit_gemm_wgmma``: the NHWC implicit GEMM on Hopper wgmma (sm_90a, fp16 /
bf16; kernels/conv2d/implicit_gemm_wgmma.cu).

The patch matrix is gathered by cp.async straight into the 128-byte swizzled tiles that
``wgmma.mma_async`` reads (the pipeline of the matmul ``wgmma`` variant), with 8- or 16-byte
pieces of channels. Channel counts per group that are not a multiple of 4 (C = 3 first layers,
odd channels) are zero-padded first, input and weight, into the workspace
(kernels/conv2d/implicit_gemm_pad.cu): the extra channels add exact zeros, so the
convolution runs on tensor cores at any C. Any stride, padding, dilation and group count
except depthwise; 1x1 convolutions too. Split-K with the deterministic two-pass reduction;
fused epilogue (+ bias, activation, + residual). Parameters as the matmul ``wgmma`` variant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.backends.cuda import Launch
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import tiled
from dnnctl.ops.conv2d._cuda import ACT_CODE
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, Workspace
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    ELEM_BYTES,
    aligned,
    load_kernel,
    tile_ok,
    vec_for,
)
from dnnctl.ops.matmul.wgmma import (
    WG_BK,
    WG_SPACE,
    wg_heuristic,
    wg_space_ok,
    wg_tile,
    wgmma_device_ok,
)
from dnnctl.ops.registry import register_variant


def padded_channels(cg: int) -> int:
    """Channels per group the kernel gathers: cg itself when a multiple of 4 (8-byte pieces),
    else 4 for cg < 4 and the next multiple of 8 above (16-byte pieces)."""
    if cg % 4 == 0:
        return cg
    return 4 if cg < 4 else -(-cg // 8) * 8


def _kgemm(g: ConvGeom) -> int:
    return padded_channels(g.cg) * g.r * g.s


def _splits(g: ConvGeom, splitk: int) -> tuple[int, int]:
    return tiled.split_k(_kgemm(g), WG_BK, splitk)


def _workspace(g: ConvGeom, splitk: int) -> Workspace:
    """Padded input and weight (when the channels need padding), then split-K slabs."""
    return tiled.padded_workspace(g, padded_channels(g.cg), _splits(g, splitk)[1])


@register_variant
class ImplicitGemmWgmma(CudaConv):
    """NHWC implicit-GEMM convolution on Hopper wgmma with a fused epilogue."""

    name = "implicit_gemm_wgmma"
    source = "conv2d/implicit_gemm_wgmma.cu"
    doc = ("implicit GEMM on Hopper wgmma (NHWC fp16/bf16, sm_90a): patches gathered by "
           "cp.async into swizzled smem, channels zero-padded to a multiple of 4 when needed, "
           "fused bias+act+residual, split-K")
    params = dict(WG_SPACE)

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        ok = wgmma_device_ok(g.dtype, device)
        if not ok:
            return ok
        if not g.nhwc:
            return unsupported("NHWC only (NCHW patches are pixel-contiguous: use implicit_gemm "
                               "or nhwc_implicit_gemm)")
        no = tiled.groups_unsupported(g, "one channel per group; use the depthwise variant")
        return SUPPORTED if no is None else no

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        cfg = wg_tile(params)
        if cfg is not None and cfg.threads == 128 and cfg.acc_per_thread > 64:
            return False  # one warpgroup: 128 accumulators next to the gather's state spill
        return wg_space_ok(params, g.dtype, g.npq, g.kg, _kgemm(g), g.groups, device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        return self.first_valid(problem, device,
                                [wg_heuristic(g.npq, g.kg, _kgemm(g), g.groups, device)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        ws = _workspace(geometry(problem), params["splitk"])
        return ws.nbytes if ws.pieces else 0

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = wg_tile(params)
        if cfg is None or not tile_ok(cfg, g.dtype, device):
            raise UnsupportedError(f"conv2d/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        kchunk, splits = _splits(g, params["splitk"])
        eb = ELEM_BYTES[g.dtype]
        cgp = padded_channels(g.cg)
        vec_a, vec_b = vec_for(cgp, eb), vec_for(_kgemm(g), eb)
        act = ACT_CODE[g.activation]
        bias_mode = BIAS_COL if g.bias else BIAS_NONE
        out_mode, pair = tiled.store_mode(g, splits)
        defines = {"GEMM_BM": cfg.bm, "GEMM_BN": cfg.bn, "GEMM_WM": cfg.wm,
                   "GEMM_STAGES": cfg.stages, "GEMM_VEC_A": vec_a, "GEMM_VEC_B": vec_b,
                   **tiled.epilogue_defines(g, out_mode, pair, act, bias_mode)}
        smem = cfg.smem_bytes(g.dtype)
        main = load_kernel(self.source, "conv_implicit_gemm_wgmma", defines, smem)
        tiles = -(-g.npq // cfg.bm) * -(-g.kg // cfg.bn)
        dims = tiled.gather_dims(g, g.groups * cgp, splits, kchunk)
        work = _workspace(g, params["splitk"])
        sms = device.sm_count or 132
        xp = get_backend("cupy").xp
        main_run = Launch(main, (tiles, 1, g.groups * splits), (cfg.threads, 1, 1), smem)
        fin_go = tiled.forward_finish(g, splits, act, bias_mode, sms)
        pad = tiled.channel_pad(g, cgp, sms) if cgp != g.cg else None

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            buf = work.allocate(xp) if work.pieces else {}
            if pad is not None:
                x, w = pad(inputs, buf)
            else:
                x = aligned(inputs["x"], vec_a * eb)
                w = aligned(inputs["w"], vec_b * eb)
            tiled.run_fused(main_run, fin_go, eb, x, w, inputs, outputs["y"], buf.get("ws"), dims)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.replayable = True  # type: ignore[attr-defined]  # launches only (see replay)
        return kernel
