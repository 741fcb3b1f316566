"""CUDA batch_norm backward variant ``bwd_reduce_dx``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Kernel, Problem, dtype_size
from dnnctl.ops.batch_norm.backward import epilogue_defines, fused_relu
from dnnctl.ops.registry import register_variant


@register_variant
class BnBwdReduceDx(mc.CudaBackward):
    op = "batch_norm"
    name = "bwd_reduce_dx"
    source = "norm/bn_backward.cu"
    doc = ("per-(split, channel) partial sums folded by the last block of each channel tile "
           "(parameter gradients, dx coefficients), then a vector stream for dx (walking "
           "back from the end with rev=1: L2 still holds what the sums read last): two "
           "launches, x and dy read twice")
    # tile: bytes of an NHWC row a block's channel tile spans; unroll: row pairs in flight
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8),
              "tile": (128, 512), "unroll": (1, 2, 4), "rev": (0, 1)}

    @staticmethod
    def coef_floats(problem: Problem) -> int:
        """The dx pass's per-channel coefficients: a, b, c0 (and the fused ReLU's mask scale
        and beta)."""
        return (5 if fused_relu(problem) else 3) * problem["c"]

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if not sp.vec_ok(problem, params["vec"]):
            return False
        # NCHW: one channel per block, tile and unroll unused
        return problem["layout"] == "NHWC" or (params["tile"] == 128 and params["unroll"] == 1)

    def grid(self, problem: Problem, params: Mapping[str, Any], vec: int,
             sms: int) -> tuple[int, int]:
        """(splits, channel tiles) of the reduction kernel."""
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        block, waves = params["block"], params["waves"]
        if problem["layout"] == "NCHW":
            return max(1, min(mc.cdiv(sms * waves, c), mc.cdiv(n * hw // vec, block),
                              65535)), c
        tx = sp.tile_lanes(problem, vec, params["tile"], block)
        tiles = mc.cdiv(c // vec, tx)
        return max(1, min(mc.cdiv(sms * waves, tiles),
                          mc.cdiv(n * hw, (block // tx) * params["unroll"]), 65535)), tiles

    def layout(self, problem: Problem, params: Mapping[str, Any], vec: int,
               sms: int) -> tuple[int, int, int, int]:
        """(splits, tiles, float offset of the coefficients, of the counters)."""
        s, tiles = self.grid(problem, params, vec, sms)
        coef = sp.pad4(2 * problem["c"] * s)
        return s, tiles, coef, coef + sp.pad4(self.coef_floats(problem))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 4 * max(k + t for _, t, _, k in (self.layout(problem, params, v, 132)
                                                for v in (params["vec"], 1)))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if sp.vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        numel = sp.numel(problem)
        itype = mc.index_type(numel)
        block, nchw = params["block"], problem["layout"] == "NCHW"
        rev = int(params["rev"])

        def reduce_name(v: int) -> str:
            if nchw:
                return f"bn_bwd_reduce_planes<{block},{v}>"
            return f"bn_bwd_reduce_rows<{block},{v},{params['unroll']},{params['tile']}>"

        names = [reduce_name(v) for v in vecs]
        names += [f"bn_bwd_dx<{block},{v},{itype},{rev}>" for v in vecs]
        mod = mc.compile_cuda(self.source, {
            "DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "AFFINE": int(problem["affine"]),
            "LAYOUT": int(not nchw), **epilogue_defines(problem)}, names, device)
        sms = mc.sm_count(device)

        def program(v: int) -> Any:
            s, tiles, coef_off, cnt_off = self.layout(problem, params, v, sms)
            ws = mc.workspace(device, 4 * (cnt_off + tiles))
            ws.fill(0)  # the counters start at zero; every call leaves them at zero
            part = ws[:2 * c * s]
            coef = ws[coef_off:coef_off + self.coef_floats(problem)]
            counters = ws[cnt_off:cnt_off + tiles].view(np.int32)
            if nchw:
                red = mc.launch(mod, reduce_name(v), (c, s), block)
                rdims = red.consts(np.int32(n), np.int32(c), np.int32(hw))
            else:
                red = mc.launch(mod, reduce_name(v), (s, tiles), block, 8 * block * v)
                rdims = red.consts(np.int64(n * hw), np.int32(c))
            nvec = numel // v
            dx = mc.stream_launch(mod, f"bn_bwd_dx<{block},{v},{itype},{rev}>", nvec, block,
                                  device)
            ddims = dx.consts(mc.index_scalar(nvec, itype), np.int32(c), np.int32(hw))

            def go(dy: Any, x: Any, w: Any, mean: Any, invstd: Any, dxa: Any, dw: Any,
                   db: Any, bias: Any, z: Any, dz: Any) -> None:
                red((dy, x, mean, part, counters, *rdims, invstd, w, dw, db, coef, bias, z))
                dx((dy, x, mean, coef, dxa, *ddims, z, dz))

            return go

        return BnBwdKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                           ("save_mean", "save_invstd"))


class BnBwdKernel(sp.NormBwdKernel):
    """NormBwdKernel with the forward's bias and residual passed on (the fused ReLU's mask),
    and the residual's gradient (None where the key has none)."""

    __slots__ = ()

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        dy, x, dx = inputs["dy"], inputs["x"], outputs["dx"]
        z, dz = inputs.get("residual"), outputs.get("dresidual")
        go = self.fast if mc.aligned(self.align, dy, x, dx, z, dz) else self.safe
        go(dy, x, inputs.get("weight"), inputs[self.stats[0]], inputs[self.stats[1]], dx,
           outputs.get("dweight"), outputs.get("dbias"), inputs.get("bias"), z, dz)


# ----------------------------------------------------------------------------- numpy
