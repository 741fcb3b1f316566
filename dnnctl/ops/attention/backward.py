"""``mma_bwd``: our attention backward (kernels/attention/bwd_mma.cu), deterministic.

Three launches: D_i = rowsum(dO * O) into a workspace laid out like lse; dK / dV with one
block per key tile of each key/value head (its GQA group's query heads summed inside the
block, no atomics); dQ with one block per query tile. The only workspace is D_i (4 bytes per
query row), whatever the sequence length. Parameters: bm (query tile), bn (key tile).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.attention.cupy_variants import (
    CupyAttention,
    mma_unsupported,
    require_aligned,
    strides,
)
from dnnctl.ops.attention.op import CAUSAL, attn_scale, lse_shape
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support
from dnnctl.ops.registry import register_variant

SOURCE = "attention/bwd_mma.cu"
BWD_HEAD_DIMS = (32, 64, 96, 128)


def bwd_smem(p: Problem, bm: int, bn: int) -> tuple[int, int]:
    """Shared bytes of the dK/dV kernel and of the dQ kernel."""
    d, dv = p["head_dim"] + 8, p["head_dim_v"] + 8
    dkdv = 2 * (bn * (d + dv) + bm * (d + dv)) + 8 * bm
    dq = 2 * (bm * (d + dv) + 2 * bn * (d + dv))
    return dkdv, dq


@register_variant
class MmaBackward(CupyAttention):
    """FA2-style backward on mma.sync with a deterministic two-kernel dQ / dK dV split."""

    name = "mma_bwd"
    source = SOURCE
    passes = ("backward",)
    params = {"bm": (32, 64, 128), "bn": (32, 64, 128)}
    doc = ("flash attention backward on mma.sync (sm_80+): dK/dV per key tile summing the "
           "GQA group without atomics, dQ per query tile; deterministic, workspace = D_i")

    def supports(self, problem: Problem, device: Any) -> Support:
        no = mma_unsupported(problem, device, BWD_HEAD_DIMS,
                             "the backward kernel keeps dK and dV in registers; built for")
        return SUPPORTED if no is None else no

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        p, bm, bn = problem, params["bm"], params["bn"]
        limit = getattr(device, "smem_per_block_optin", 0) or 227 * 1024
        if max(bwd_smem(p, bm, bn)) > limit:
            return False
        # fp32 accumulators per thread: dK + dV + S^T + dP^T (dkdv), dQ + S + dP (dq)
        if p["head_dim"] // 2 + p["head_dim_v"] // 2 + bm > 200:
            return False
        if p["head_dim"] // 2 + bn > 160:
            return False
        return not (bm > 32 and bm >= 2 * -(-p["seq_q"] // 16) * 16)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        params = {"bm": 64, "bn": 64}
        return self.first_valid(problem, device, [params])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 4 * int(np.prod(lse_shape(problem)))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        if not self.supports(problem, device) or not self.valid_params(problem, params, device):
            raise UnsupportedError(f"attention/{self.name}: {dict(params)} not legal here")
        return BackwardKernel(problem, int(params["bm"]), int(params["bn"]))


class BackwardKernel:
    """Launcher of attn_bwd_dot, attn_bwd_dkdv and attn_bwd_dq."""

    flat_io = True

    def __init__(self, p: Problem, bm: int, bn: int) -> None:
        be = get_backend("cupy")
        self.xp = be.xp
        mod = be.compile_module(SOURCE, defines={
            "DNNCTL_DTYPE": codes.DTYPE[p["dtype"]], "ATT_D": p["head_dim"], "ATT_DV": p["head_dim_v"],
            "ATT_BM": bm, "ATT_BN": bn, "ATT_MASK": CAUSAL.index(p["causal"]),
            "ATT_SOFTCAP": int(p["softcap"] > 0), "ATT_VARLEN": int(p["varlen"])})
        self.dot = mod.get_function("attn_bwd_dot")
        self.dkdv = mod.get_function("attn_bwd_dkdv")
        self.dq = mod.get_function("attn_bwd_dq")
        self.smem = bwd_smem(p, bm, bn)
        for fn, sm in ((self.dkdv, self.smem[0]), (self.dq, self.smem[1])):
            if sm > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = sm
        b, hq, hkv, sq, skv = p["batch"], p["heads_q"], p["heads_kv"], p["seq_q"], p["seq_kv"]
        self.p, self.bm, self.bn = p, bm, bn
        grids = ((-(-sq // 4), hq, b), (-(-skv // bn), hkv, b), (-(-sq // bm), hq, b))
        # launched through the CUDA seam: torch CUDA tensors go by data_ptr (flat path)
        self.dot_l = cuda.Launch(self.dot, grids[0], (128, 1, 1))
        self.dkdv_l = cuda.Launch(self.dkdv, grids[1], (bn // 16 * 32, 1, 1), self.smem[0])
        self.dq_l = cuda.Launch(self.dq, grids[2], (bm // 16 * 32, 1, 1), self.smem[1])
        st = strides(p)
        self.qkvo = [np.int64(x) for n in ("q", "k", "v", "out") for x in st[n]]
        self.ls = [np.int64(st["lse"][0]), np.int64(st["lse"][1])]
        self.lse_shape = lse_shape(p)

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        p = self.p
        require_aligned(inputs, ("q", "k", "v", "out", "dout"))
        dvec = cuda.scratch(self.lse_shape, dtype=np.float32)
        cq, ck = inputs.get("cu_seqlens_q"), inputs.get("cu_seqlens_k")
        sizes = (np.int32(p["seq_q"]), np.int32(p["seq_kv"]))
        tail = (*sizes, np.int32(p["heads_q"] // p["heads_kv"]), np.int32(p["window"]),
                np.float32(attn_scale(p, attrs)), np.float32(p["softcap"]))
        self.dot_l((
            inputs["out"], inputs["dout"], dvec, cq, ck, *self.qkvo[9:12], *self.ls, *sizes))
        common = (inputs["q"], inputs["k"], inputs["v"], inputs["dout"], inputs["lse"], dvec)
        self.dkdv_l((
            *common, outputs["dk"], outputs["dv"], cq, ck, *self.qkvo, *self.ls, *tail))
        self.dq_l((*common, outputs["dq"], cq, ck, *self.qkvo, *self.ls, *tail))
