"""attention ``wgmma_bwd``: our Hopper backward (kernels/attention/bwd_wgmma.cu, sm_90a).

FlashAttention-3 style: one block per 128-key tile of a key/value head, a producer warp
copying Q, dO (TMA) and lse, D of each query tile into a ring of stages, two consumer
warpgroups of 64 keys running all five products on ``wgmma.mma_async``: S^T = K Q^T and
dP^T = V dO^T from shared memory, dV += P^T dO and dK += dS^T Q with P and dS straight from
registers, and dQ = dS K from a shared dS^T tile, its partials staged in shared memory and
added to an fp32 accumulator by one bulk reduction of the copy engine per tile (issued by a
producer thread, off the consumers' path). Three launches: D_i = rowsum(dO * O) (zeroing
the dQ accumulator), the main kernel, and dQ rounded to the I/O dtype. Not deterministic
(the reductions' order varies): under ``dnnctl.use_deterministic`` / ``torch.use_deterministic_algorithms``
``mma_bwd`` runs instead.

Parameters: bm (query tile: 128 at head dims <= 64, else 64 -- dK, dV, S^T and dP^T must fit
the consumers' 240 registers) and stages (ring depth). Head dims up to 128 (multiples of 8),
GQA, both layouts, varlen, every mask, windows and softcap. A call whose q / k / v / out /
dout are not 16-byte aligned runs ``mma_bwd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda, tma
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.attention.backward import MmaBackward
from dnnctl.ops.attention.cupy_variants import CupyAttention, strides
from dnnctl.ops.attention.op import CAUSAL, attn_scale, pass_of
from dnnctl.ops.attention.wgmma import qkv_map, tma_rows_support, wgmma_n
from dnnctl.ops.base import Kernel, LazyKernel, Problem, Support, unsupported
from dnnctl.ops.registry import register_variant

SOURCE = "attention/bwd_wgmma.cu"
BN = 128  # keys per block: two consumer warpgroups of 64
# dK (dp / 2) + dV (dvp / 2) + S^T and dP^T (bm / 2 each) per consumer thread: at most 192 of
# the 240 registers the consumers get from the producer (the rest: addresses, the softmax)
REG_BUDGET = 192


def bwd_wg_smem(p: Problem, params: Mapping[str, Any]) -> int:
    """K, V; Q and dO rings; two dS^T buffers; lse / D rings; the dQ tile; barriers; 1 KB
    slack."""
    bm, st = params["bm"], params["stages"]
    dp = wgmma_n(p["head_dim"])
    kc, vc = dp // 64, wgmma_n(p["head_dim_v"]) // 64
    return (128 * (BN * (kc + vc) + st * bm * (kc + vc)) + 2 * bm * BN * 2 + st * 2 * bm * 4
            + bm * dp * 4 + 8 * (3 + 2 * st) + 1024)


def bwd_wg_regs_ok(p: Problem, bm: int) -> bool:
    """The accumulators fit, and each consumer's share of dQ is one wgmma N (64 or 128):
    64 query rows of all head-dim columns (bm 128) or half the columns (bm 64)."""
    dp, dvp = wgmma_n(p["head_dim"]), wgmma_n(p["head_dim_v"])
    dqn = dp if bm == 128 else dp // 2
    return dp // 2 + dvp // 2 + bm <= REG_BUDGET and dqn in (64, 128)


def dq_tiles(p: Problem, bm: int) -> int:
    """Query tiles of the fp32 dQ accumulator (each heads x bm x padded head dim, laid out
    like the consumers' fragments: see the kernel): every sequence's tiles; varlen numbers
    sequence b's from floor(cu_q[b] / bm) + b."""
    if p["varlen"]:
        return p["seq_q"] // bm + p["batch"]
    return p["batch"] * -(-p["seq_q"] // bm)


def stats_shape(p: Problem) -> tuple[int, int, int]:
    """The (lse log2e, D) workspace: per batch and head two rows of the query positions
    padded to a multiple of 4 floats (16-byte rows for the copy engine). varlen: per head,
    the sequences one after the other, each starting at a multiple of 4 floats (a copy's
    innermost coordinate must be 16-byte aligned): round_up(total, 4) + 4 x batch."""
    pad = -(-p["seq_q"] // 4) * 4
    if p["varlen"]:
        return p["heads_q"], 2, pad + 4 * p["batch"]
    return p["batch"] * p["heads_q"], 2, pad


def stats_map(p: Problem, bm: int) -> tma.MapSpec:
    """3-d map of the stats workspace: {positions, 2, rows}, boxes of bm positions x both."""
    rows, _, pad = stats_shape(p)
    extent = pad if p["varlen"] else p["seq_q"]
    return tma.MapSpec("float32", (extent, 2, rows), (pad * 4, 2 * pad * 4), (bm, 2, 1),
                       tma.SWIZZLE_NONE)


@register_variant
class WgmmaBackward(CupyAttention):
    """Hopper attention backward: TMA producer, wgmma consumers, dQ by fp32 reductions."""

    name = "wgmma_bwd"
    source = SOURCE
    passes = ("backward",)
    deterministic = False  # dq is accumulated with reductions in no fixed order
    params = {"bm": (64, 128), "stages": (2, 3)}
    doc = ("flash attention backward for Hopper (fp16/bf16, sm_90a): TMA loads, two wgmma "
           "consumer warpgroups of 64 keys with dK / dV in registers, P from registers, dQ "
           "added in fp32 by the copy engine's bulk reductions (not deterministic)")

    def supports(self, problem: Problem, device: Any) -> Support:
        p = problem
        if pass_of(p) != "backward":
            return unsupported("the wgmma_bwd kernel is the backward pass (forward: wgmma)")
        if p["paged"]:
            return unsupported("a paged KV cache is a decode layout, without a backward")
        ok = tma_rows_support(p, device, 128, "at most 128 (dK and dV stay in registers)")
        if ok and not any(bwd_wg_regs_ok(p, bm) for bm in self.params["bm"]):
            return unsupported(f"head_dim={p['head_dim']} with head_dim_v="
                               f"{p['head_dim_v']}: no query tile fits the registers")
        return ok

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        limit = getattr(device, "smem_per_block_optin", 0) or 227 * 1024
        return (bwd_wg_regs_ok(problem, params["bm"])
                and bwd_wg_smem(problem, params) <= limit)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        return self.first_valid(problem, device, [{"bm": bm, "stages": 2} for bm in (128, 64)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        p, bm = problem, params["bm"]
        return 4 * (int(np.prod(stats_shape(p)))
                    + dq_tiles(p, bm) * p["heads_q"] * bm * wgmma_n(p["head_dim"]))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        if not self.supports(p, device) or not self.valid_params(p, params, device):
            raise UnsupportedError(f"attention/{self.name}: {dict(params)} not legal here")
        bm = int(params["bm"])
        maps = {"q": tma.MapCache(qkv_map(p, "q", bm)), "k": tma.MapCache(qkv_map(p, "k", BN)),
                "v": tma.MapCache(qkv_map(p, "v", BN)), "out": tma.MapCache(qkv_map(p, "out", bm)),
                "stats": tma.MapCache(stats_map(p, bm))}
        smem = bwd_wg_smem(p, params)
        mod = get_backend("cupy").compile_module(SOURCE, defines={
            "DNNCTL_DTYPE": codes.DTYPE[p["dtype"]], "ATT_D": p["head_dim"],
            "ATT_DV": p["head_dim_v"], "ATT_BM": bm, "ATT_STAGES": int(params["stages"]),
            "ATT_MASK": CAUSAL.index(p["causal"]), "ATT_SOFTCAP": int(p["softcap"] > 0),
            "ATT_VARLEN": int(p["varlen"]), "ATT_LAYOUT": int(p["layout"] != "BHSD")})
        b, hq, hkv, sq, skv = p["batch"], p["heads_q"], p["heads_kv"], p["seq_q"], p["seq_kv"]
        rows_grid = (-(-sq // 4), hq, b)
        pre = cuda.launch(mod, "attn_bwdw_pre", rows_grid, 128)
        main = cuda.launch(mod, "attn_bwdw", (-(-skv // BN), hkv, b), 384, smem)
        post = cuda.launch(mod, "attn_bwdw_post", rows_grid, 128)
        st = strides(p)
        i32, i64 = np.int32, np.int64
        qs, ks, vs, os_ = (tuple(i64(x) for x in st[n]) for n in ("q", "k", "v", "out"))
        ls = (i64(st["lse"][0]), i64(st["lse"][1]))
        sizes = (i32(sq), i32(skv), i32(hq))
        tail = (i32(hq // hkv), i32(p["window"]))
        softcap = np.float32(p["softcap"])
        acc_shape = (dq_tiles(p, bm), hq, bm * wgmma_n(p["head_dim"]))
        sshape = stats_shape(p)
        spad = i32(sshape[2])
        ptr = cuda.ptr
        mma = MmaBackward()
        fallback = LazyKernel(lambda: mma.build(p, mma.default_params(p, device), device))

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            pq, pk, pv = ptr(inputs["q"]), ptr(inputs["k"]), ptr(inputs["v"])
            po, pdo = ptr(inputs["out"]), ptr(inputs["dout"])
            if (pq | pk | pv | po | pdo) & 15:  # the copy engine needs 16-byte aligned bases
                fallback(inputs, outputs, attrs)
                return
            scale = np.float32(attn_scale(p, attrs))
            stats = cuda.workspace(sshape, np.float32)  # read by address only
            acc = cuda.workspace(acc_shape, np.float32)
            cq, ck = inputs.get("cu_seqlens_q"), inputs.get("cu_seqlens_k")
            pre((inputs["out"], inputs["dout"], inputs["lse"], stats, acc, cq, ck, *os_, *ls,
                 *sizes, spad))
            main((maps["q"](pq), maps["k"](pk), maps["v"](pv), maps["out"](pdo),
                  maps["stats"](ptr(stats)), acc, outputs["dk"], outputs["dv"], cq, ck, *ks,
                  *vs, *sizes, *tail, scale, softcap))
            post((acc, outputs["dq"], cq, ck, *qs, *sizes, scale))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel
