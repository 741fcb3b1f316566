"""batch_norm training forward in two launches (x read twice): ``train_lastblock``.

Statistics with ``unroll`` loads in flight per thread and partial sums shifted by each
channel's first value; the last block of each channel tile folds the partials (fixed order)
and writes the saved / running statistics and the scale, so no finalize launch is needed; then
the exact-grid normalize walking x backwards (kernels/norm/bn_onepass.cu).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Problem, Support, unsupported
from dnnctl.ops.batch_norm.cuda_exact import _StreamBuild, exact_launch, exact_name
from dnnctl.ops.batch_norm.cuda_variants import _BnCuda
from dnnctl.ops.registry import register_variant


@register_variant
class BnTrainLastBlock(_StreamBuild, _BnCuda):
    name = "train_lastblock"
    fused_epilogue = True
    source = "norm/bn_onepass.cu"
    training = True
    doc = ("two launches: statistics (unroll loads in flight, shifted partial sums; the last "
           "block of each channel tile folds them and writes the statistics), then "
           "the exact-grid normalize walking x backwards")
    # tile: bytes of an NHWC row a block's channel tile spans (NCHW: unused)
    params = {"block": (256, 512), "vec": mc.VECS, "unroll": (2, 4, 8),
              "blocks_per_sm": (2, 4, 8), "tile": (128, 512)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"]) and (
            params["block"] * params["blocks_per_sm"] <= 2048) and (
            problem["layout"] == "NHWC" or params["tile"] == 128)

    def supports(self, problem: Problem, device: Any) -> Support:
        if mc.cdiv(sp.numel(problem), 128) >= 2**31:
            return unsupported("more than 2^31 blocks: use train_fused")
        return _BnCuda.supports(self, problem, device)

    def grid(self, problem: Problem, params: Mapping[str, Any], vec: int,
             sms: int) -> tuple[int, int]:
        """(splits, channel tiles) of the statistics kernel."""
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        block, u = params["block"], params["unroll"]
        resident = sms * params["blocks_per_sm"]
        if problem["layout"] == "NCHW":
            return max(1, min(mc.cdiv(resident, c), mc.cdiv(n * hw // vec, block * u),
                              65535)), c
        tx = sp.tile_lanes(problem, vec, params["tile"], block)
        tiles = mc.cdiv(c // vec, tx)
        return max(1, min(mc.cdiv(resident, tiles), mc.cdiv(n * hw, (block // tx) * u),
                          65535)), tiles

    def layout(self, problem: Problem, params: Mapping[str, Any], vec: int,
               sms: int) -> tuple[int, int, int, int]:
        """(splits, tiles, float offset of the scale, of the counters) in the workspace."""
        splits, tiles = self.grid(problem, params, vec, sms)
        scale = sp.pad4(2 * problem["c"] * splits)
        return splits, tiles, scale, scale + sp.pad4(problem["c"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        best = max((self.layout(problem, params, v, 132) for v in (params["vec"], 1)),
                   key=lambda t: t[3])
        return 4 * (best[3] + best[1])

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, u = params["block"], params["unroll"]
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        nhwc = problem["layout"] == "NHWC"

        def names(v: int) -> list[str]:
            stats = (f"bnt_stats_rows<{block},{v},{u},{params['tile']}>" if nhwc
                     else f"bnt_stats_planes<{block},{v},{u}>")
            return [stats, exact_name(problem, v)]

        vecs = self.vecs(problem, params, device)
        mod = mc.compile_cuda(self.source, {**self.defines(problem, 1), "CH": c, "HW": hw},
                              [m for v in vecs for m in names(v)], device)
        splits, tiles, s_off, k_off = self.layout(problem, params, vec, mc.sm_count(device))
        ws = mc.workspace(device, 4 * (k_off + tiles))
        ws.fill(0)  # the counters start at zero; every call leaves them at zero
        part, scale = ws[:2 * c * splits], ws[s_off:s_off + c]
        counters = ws[k_off:k_off + tiles].view(np.int32)
        if nhwc:
            stats = mc.launch(mod, names(vec)[0], (splits, tiles), block, 8 * block * vec)
            size: tuple = stats.consts(np.int64(n * hw))
        else:
            stats = mc.launch(mod, names(vec)[0], (c, splits), block)
            size = stats.consts(np.int32(n))
        norm, nsize = exact_launch(mod, problem, vec)

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv, z = arrs
            eps32 = norm.f32(eps)
            stats((x, part, counters, *size, rm, rv, nrm, nrv, smean, sinv, w, scale, eps32,
                   norm.f32(momentum)))
            norm((x, y, smean, scale, w, b, *nsize, eps32, z))

        return go
