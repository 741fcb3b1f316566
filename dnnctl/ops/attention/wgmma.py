"""attention ``wgmma``: our Hopper forward (kernels/attention/fwd_wgmma.cu, sm_90a).

FlashAttention-3 style: one producer warpgroup issues TMA copies of the Q tile and of each
key / value tile into a ring of shared-memory stages (separate K and V barriers, so the
scores of a tile start before its values land); ``consumers`` warpgroups of 64 query rows
each run both products on ``wgmma.mma_async``: S = Q K^T from shared memory, O += P V with
P straight from the registers of S (register-A form), the softmax of tile t overlapping the
tensor cores' P V of tile t - 1.

Parameters: consumers (1-3: 64, 128 or 192 query rows per block), bn (key tile: 64 or
128), stages (ring depth), pingpong (the consumers take turns to issue their products,
so one's softmax overlaps the other's tensor-core work), overlap (1: the next tile's scores
are issued with this tile's P V, softmax overlapping it; 0: one product at a time, fewer
registers). With two or three consumers the producer hands its registers to them
(setmaxnreg). Covers GQA, both layouts, varlen, all three masks, sliding windows and
softcap; head dims up to 256 (multiples of 8; chunks of 64, zero-filled by the copy engine).
Not a paged cache (``decode`` / ``mma`` take those). A call whose q / k / v are not 16-byte
aligned (views at odd offsets: the copy engine refuses them), or whose scale is not positive
(the kernel takes the maximum of the unscaled scores), runs the ``mma`` kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda, tma
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.attention.cupy_variants import CupyAttention, MmaAttention, strides
from dnnctl.ops.attention.op import CAUSAL, LOG2E, attn_scale, pass_of
from dnnctl.ops.base import Kernel, LazyKernel, Problem, Support, unsupported
from dnnctl.ops.matmul.wgmma import tma_device_ok
from dnnctl.ops.registry import register_variant

SOURCE = "attention/fwd_wgmma.cu"
# Registers a consumer thread may spend on S (bn / 2), O (dvp / 2) and P (bn / 4): its
# warpgroup's count (255 for one consumer; 240 and 160 after the producer hands its
# registers over with two and three) less ~30-50 for addresses and the softmax's
# temporaries; with the products overlapped (the next S live beside P and O) at most 176
# whatever the count. Measured with ptxas -v (sm_90a), no spills: 208 without overlap at
# two consumers (238 registers), 176 with it at one and two, 112 at three (145); spills:
# 224 with overlap at one and two consumers, 128 at three. (176-key tiles, tried: 196 with
# overlap spills; without, they ran 8-12% behind 128-key tiles with it.)
_REG_BUDGET = {1: 200, 2: 208, 3: 112}
_OVERLAP_BUDGET = 176


def _chunks(d: int) -> int:
    return -(-d // 64)


def tma_rows_support(p: Problem, device: Any, limit: int, why: str) -> Support:
    """Whether the copy engine can read q / k / v rows of ``p`` on ``device``: head dims
    multiples of 8 elements up to ``limit`` (``why`` says what bounds it), the dtype and
    sizes tma_device_ok takes."""
    for f in ("head_dim", "head_dim_v"):
        if p[f] % 8 or p[f] > limit:
            return unsupported(f"{f}={p[f]}: TMA rows need multiples of 8 elements, {why}")
    return tma_device_ok(p["dtype"], device, max(p["seq_q"], p["seq_kv"]) * p["batch"],
                         p["heads_q"] * p["batch"])


def wgmma_n(d: int) -> int:
    """The wgmma N of a product over a head dim (O += P V; the backward's dK, dV): the head
    dim rounded up to 64, 128 or 256."""
    return 64 if d <= 64 else (128 if d <= 128 else 256)


def wg_smem_bytes(p: Problem, params: Mapping[str, Any]) -> int:
    """Q tile, the K and V rings, 1 + 4 x stages barriers, 1 KB alignment slack."""
    bm, bn, st = 64 * params["consumers"], params["bn"], params["stages"]
    kc, vc = _chunks(p["head_dim"]), wgmma_n(p["head_dim_v"]) // 64
    return 128 * (kc * bm + st * bn * (kc + vc)) + 8 * (1 + 4 * st) + 1024


def wg_regs_ok(p: Problem, params: Mapping[str, Any]) -> bool:
    """S + O + P (live beside the next S when the products overlap; without overlap the
    softmax's temporaries over S still cost ~16) within the budget."""
    bn = params["bn"]
    overlap = params.get("overlap", 1)
    budget = _REG_BUDGET[params["consumers"]]
    if overlap:
        budget = min(budget, _OVERLAP_BUDGET)
    return bn // 2 + wgmma_n(p["head_dim_v"]) // 2 + (bn // 4 if overlap else 16) <= budget


def qkv_map(p: Problem, name: str, rows: int) -> tma.MapSpec:
    """The 3-d map of q / k / v / out (out: also dout; see the kernel's header): innermost
    the head dim, boxes of 64 x ``rows``."""
    d = p["head_dim_v"] if name in ("v", "out") else p["head_dim"]
    heads = p["heads_q"] if name in ("q", "out") else p["heads_kv"]
    seq = p["seq_q"] if name in ("q", "out") else p["seq_kv"]
    esz = tma.ELEM_BYTES[p["dtype"]]
    if p["layout"] == "BHSD":  # (varlen is always BSHD: Attention.check)
        return tma.MapSpec(p["dtype"], (d, seq, p["batch"] * heads),
                           (d * esz, seq * d * esz), (64, rows, 1))
    total = seq if p["varlen"] else p["batch"] * seq
    return tma.MapSpec(p["dtype"], (d, heads, total), (d * esz, heads * d * esz), (64, 1, rows))


def map_specs(p: Problem, params: Mapping[str, Any]) -> dict[str, tma.MapSpec]:
    bm = 64 * params["consumers"]
    return {"q": qkv_map(p, "q", bm), "k": qkv_map(p, "k", params["bn"]),
            "v": qkv_map(p, "v", params["bn"])}


def wg_defines(p: Problem, params: Mapping[str, Any]) -> dict[str, int]:
    return {"DNNCTL_DTYPE": codes.DTYPE[p["dtype"]], "ATT_D": p["head_dim"], "ATT_DV": p["head_dim_v"],
            "ATT_CONS": params["consumers"], "ATT_BN": params["bn"],
            "ATT_STAGES": params["stages"], "ATT_MASK": CAUSAL.index(p["causal"]),
            "ATT_SOFTCAP": int(p["softcap"] > 0), "ATT_VARLEN": int(p["varlen"]),
            "ATT_LAYOUT": int(p["layout"] != "BHSD"),
            "ATT_PINGPONG": int(params.get("pingpong", 0)),
            "ATT_OVERLAP": int(params.get("overlap", 1))}


def wg_heuristic(p: Problem) -> dict[str, Any]:
    """The consumers' turns and the overlapped products on, and the biggest tile whose
    registers fit (measured on the H200, bf16/fp16 B2-4 S1000-4096, FlashAttention-3's
    choice too): 128 query rows (two consumers) of 128-key tiles up to value head dim 128,
    of 64-key tiles at 256 (without turns: there they cost 4%); one consumer of 64-key
    tiles when the queries fit 64 rows (products overlapped only at 256: 13-25% slower
    below)."""
    dvp = wgmma_n(p["head_dim_v"])
    if p["seq_q"] <= 64 and not p["varlen"]:  # no block wider than the queries
        return {"consumers": 1, "bn": 64, "stages": 2, "pingpong": 0,
                "overlap": int(dvp > 128)}
    return {"consumers": 2, "bn": 128 if dvp <= 128 else 64, "stages": 2,
            "pingpong": int(dvp <= 128), "overlap": 1}


@register_variant
class WgmmaAttention(CupyAttention):
    """Hopper attention forward: TMA producer, wgmma consumers, P from registers."""

    name = "wgmma"
    source = SOURCE
    params = {"consumers": (1, 2, 3), "bn": (64, 128), "stages": (2, 3), "pingpong": (0, 1),
              "overlap": (0, 1)}
    doc = ("flash attention forward for Hopper (fp16/bf16, sm_90a): TMA loads into K / V "
           "mbarrier rings, producer + 1-3 wgmma consumer warpgroups, P fed from registers, "
           "softmax overlapped with P V; GQA / varlen / masks / window / softcap")

    def supports(self, problem: Problem, device: Any) -> Support:
        p = problem
        if pass_of(p) != "forward":
            return unsupported("the wgmma kernel is the forward pass (backward: wgmma_bwd, mma_bwd)")
        if p["paged"]:
            return unsupported("a paged KV cache is read by the decode / mma kernels")
        return tma_rows_support(p, device, 256, "at most 256")

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        limit = getattr(device, "smem_per_block_optin", 0) or 227 * 1024
        if wg_smem_bytes(problem, params) > limit or not wg_regs_ok(problem, params):
            return False
        rows = problem["seq_q"]
        if params.get("pingpong") and params["consumers"] == 1:
            return False  # turns need two consumers
        # no block of queries twice the queries (only padding rows)
        return params["consumers"] == 1 or 64 * params["consumers"] < 2 * -(-rows // 64) * 64

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        params = wg_heuristic(problem)
        return self.first_valid(problem, device, [params])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        if not self.supports(p, device) or not self.valid_params(p, params, device):
            raise UnsupportedError(f"attention/{self.name}: {dict(params)} not legal here")
        maps = {n: tma.MapCache(s) for n, s in map_specs(p, params).items()}
        smem = wg_smem_bytes(p, params)
        mod = get_backend("cupy").compile_module(SOURCE, defines=wg_defines(p, params))
        bm = 64 * params["consumers"]
        grid = (-(-p["seq_q"] // bm), p["heads_q"], p["batch"])
        run = cuda.launch(mod, "attn_fwd_wgmma", grid, (128 * (params["consumers"] + 1), 1, 1),
                          smem)
        st = strides(p)
        i32, i64 = np.int32, np.int64
        ostr = tuple(i64(x) for x in st["out"])
        lstr = (i64(st["lse"][0]), i64(st["lse"][1]))
        shape = (i32(p["seq_q"]), i32(p["seq_kv"]), i32(p["heads_q"]),
                 i32(p["heads_q"] // p["heads_kv"]), i32(p["window"]))
        softcap = np.float32(p["softcap"])
        ptr = cuda.ptr
        mma = MmaAttention()
        fallback = LazyKernel(lambda: mma.build(p, mma.default_params(p, device), device))

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            pq, pk, pv = ptr(inputs["q"]), ptr(inputs["k"]), ptr(inputs["v"])
            scale = attn_scale(p, attrs)
            # the copy engine needs 16-byte aligned bases; the kernel's max runs on unscaled
            # scores, so it takes scale > 0
            if (pq | pk | pv) & 15 or not scale > 0:
                fallback(inputs, outputs, attrs)
                return
            scale_log2 = np.float32(scale * LOG2E)
            run((maps["q"](pq), maps["k"](pk), maps["v"](pv), outputs["out"], outputs["lse"],
                 inputs.get("cu_seqlens_q"), inputs.get("cu_seqlens_k"), *ostr, *lstr,
                 *shape, scale_log2, softcap))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel
