"""attention ``decode_ring``: split-KV flash-decoding for Hopper (kernels/attention/decode_ring.cu,
sm_90).

For short queries over long caches the op is a stream of the KV cache, so what decides its
speed is how many bytes each SM keeps in flight. The ``decode`` kernel (one warp, a two-stage
cp.async double buffer) reached 51-81 % of the copy bandwidth on the H200. Here one producer
warp copies key / value tiles (16-byte cp.async chunks, each lane's
``cp.async.mbarrier.arrive`` completing a stage's barrier) into a ring of ``warps x depth``
stages, and ``warps`` consumer warps each take every ``warps``-th key tile (mma.sync products and online
softmax as in ``mma``), the warps merge in shared memory, and with several splits the last
split block of each row block merges the splits: one launch, no combine kernel.

Parameters: bm (16 or 32 packed (query, head) rows per block), bn (keys per tile), warps
(consumer warps), depth (ring stages per consumer warp). The number of splits is not a
parameter: it is chosen at build to fill whole waves of the device's resident blocks (the
fewest splits whose waves are >= 90 % full, each warp keeping >= 2 tiles).

Rows past 64 per key/value head, varlen batches and backward go elsewhere. q / k / v must
start 16-byte aligned (16-byte copies, as the mma kernels): a view at an odd element offset
is refused with a clear error, not a misaligned-address fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import codes
from dnnctl.ops.attention.cupy_variants import (
    HEAD_DIMS,
    CupyAttention,
    launch_strides,
    mma_unsupported,
    require_aligned,
)
from dnnctl.ops.attention.op import CAUSAL, LOG2E, attn_scale, kv_pages, pass_of
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.registry import register_variant

SOURCE = "attention/decode_ring.cu"
SM_SMEM = 228 * 1024  # shared memory of an sm_90 SM (each block also reserves 1 KiB)


def packed_rows(p: Problem) -> int:
    """(query, head) rows per key/value head: seq_q x the GQA group."""
    return p["seq_q"] * (p["heads_q"] // p["heads_kv"])


def dec_smem(p: Problem, params: Mapping[str, Any]) -> int:
    """Q tile + the ring (or the end-of-block merge, if larger) + 2 mbarriers per stage."""
    d, dv = p["head_dim"], p["head_dim_v"]
    bm, bn, w = params["bm"], params["bn"], params["warps"]
    stages = w * params["depth"]
    ring = max(2 * stages * bn * (d + 8 + dv + 8), 4 * w * bm * (dv + 2))
    return 2 * bm * (d + 8) + ring + 16 * stages


def dec_grid(p: Problem, params: Mapping[str, Any], sms: int) -> tuple[int, int, int]:
    """(splits, row blocks, tiles per split). Splits: the fewest whose grid fills >= 90 % of
    its last wave of resident blocks, each consumer warp keeping >= 2 key tiles; else the
    fullest last wave."""
    mblocks = -(-packed_rows(p) // params["bm"])
    tiles = -(-p["seq_kv"] // params["bn"])
    per_sm = max(1, min(SM_SMEM // (dec_smem(p, params) + 1024),
                        2048 // (32 * (params["warps"] + 1))))
    slots = max(1, sms) * per_sm
    blocks = p["batch"] * p["heads_kv"] * mblocks
    best, best_fill = 1, 0.0
    for s in range(1, 65):
        if s > 1 and -(-tiles // s) < 2 * params["warps"]:
            break
        waves = blocks * s / slots
        fill = waves / -(-waves // 1)
        if fill >= 0.9:
            best = s
            break
        if fill > best_fill + 1e-9:
            best, best_fill = s, fill
    return best, mblocks, -(-tiles // best)


@register_variant
class DecodeRingAttention(CupyAttention):
    """Split-KV decode with a producer warp, a ring of K / V tiles and several consumer warps."""

    name = "decode_ring"
    source = SOURCE
    params = {"bm": (16, 32), "bn": (32, 64), "warps": (1, 2, 4), "depth": (2, 3, 4)}
    doc = ("split-KV flash-decoding for Hopper (sm_90): a producer warp copies K / V tiles "
           "(cp.async, mbarrier arrivals) into a warps x depth ring, consumer warps run mma.sync on "
           "alternate key tiles, warps and splits merged in the one launch; GQA packing, "
           "paged KV cache")

    def supports(self, problem: Problem, device: Any) -> Support:
        p = problem
        if pass_of(p) != "forward":
            return unsupported("decode_ring is a forward kernel")
        if device.cc_tuple < (9, 0):
            return unsupported(f"built and measured for sm_90 (mbarrier rings); "
                               f"{device.name} is {device.compute_capability}")
        no = mma_unsupported(p, device, HEAD_DIMS)  # its products are the mma kernel's
        if no is not None:
            return no
        if p["varlen"]:
            return unsupported("decode_ring takes fixed-length queries (varlen: use mma)")
        if packed_rows(p) > 64:
            return unsupported(f"{packed_rows(p)} query rows per kv head (seq_q x group) "
                               "exceed 64: a prefill (use wgmma / mma)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        p = problem
        limit = getattr(device, "smem_per_block_optin", 0) or 227 * 1024
        bm, bn = params["bm"], params["bn"]
        if bm == 32 and packed_rows(p) <= 16:
            return False  # half the rows padding
        # fp32 accumulators per thread: O (dv / 2) + S (bn / 2) per m16 tile (ptxas, sm_90a:
        # two tiles of 160 spill)
        if bm // 16 * (p["head_dim_v"] // 2 + bn // 2) > (160 if bm == 16 else 144):
            return False
        if bn == 64 and p["seq_kv"] <= 32:
            return False  # a tile of padding
        return dec_smem(p, params) <= limit

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        """16 rows where they hold the group; 32-key tiles, four consumer warps of two stages
        each, else fewer where shared memory is short. Measured on the H200 over six decode
        shapes (GQA 32/8 and 64/8 at head dim 128 from 1 x 32k to 64 x 1k keys, MHA at 64):
        the fastest or within 5 % of it on five, 8 % behind on 64 x 1k (benchmarks/RESULTS.md)."""
        p = problem
        bm = 16 if packed_rows(p) <= 16 else 32
        cands = [{"bm": bm, "bn": 32, "warps": w, "depth": d}
                 for w, d in ((4, 2), (2, 3), (2, 2), (1, 2))]
        return self.first_valid(p, device, cands)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        p = problem
        splits = dec_grid(p, params, 132)[0]
        if splits <= 1:
            return 0
        return 4 * splits * p["batch"] * p["heads_q"] * p["seq_q"] * (p["head_dim_v"] + 1)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        if not self.supports(p, device) or not self.valid_params(p, params, device):
            raise UnsupportedError(f"attention/{self.name}: {dict(params)} not legal here")
        defines = {"DNNCTL_DTYPE": codes.DTYPE[p["dtype"]], "ATT_D": p["head_dim"],
                   "ATT_DV": p["head_dim_v"], "ATT_BM": params["bm"], "ATT_BN": params["bn"],
                   "ATT_MASK": CAUSAL.index(p["causal"]), "ATT_SOFTCAP": int(p["softcap"] > 0),
                   "ATT_PAGED": p["paged"], "DEC_WARPS": params["warps"],
                   "DEC_DEPTH": params["depth"]}
        mod = get_backend("cupy").compile_module(SOURCE, defines=defines)
        splits, mblocks, tps = dec_grid(p, params, mc.sm_count(device))
        grid = (splits, p["heads_kv"] * mblocks, p["batch"])
        run = cuda.launch(mod, "attn_decode_ring", grid, (32 * (params["warps"] + 1), 1, 1),
                          dec_smem(p, params))
        counters: list[Any] = []  # one per row block, made on the first call (zero; every
        # launch leaves them zero)
        i32 = np.int32
        ptr_strides, lstr = launch_strides(p)
        tail = (i32(p["seq_q"]), i32(p["seq_kv"]), i32(p["heads_q"]),
                i32(p["heads_q"] // p["heads_kv"]), i32(p["window"]))
        softcap = np.float32(p["softcap"])
        table_stride = i32(kv_pages(p))
        nrows = p["batch"] * p["heads_q"] * p["seq_q"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            require_aligned(inputs, ("q", "k", "v"))
            ws_o = ws_lse = None
            if splits > 1:
                if not counters:
                    ws = mc.workspace(device, 4 * p["batch"] * p["heads_kv"] * mblocks)
                    ws.fill(0)
                    counters.append(ws.view(np.int32))
                ws_o = cuda.workspace((splits * nrows * p["head_dim_v"],), np.float32)
                ws_lse = cuda.workspace((splits * nrows,), np.float32)
            run((inputs["q"], inputs["k"], inputs["v"], outputs["out"], outputs["lse"], ws_o,
                 ws_lse, counters[0] if counters else None, inputs.get("block_table"), inputs.get("seqused_k"),
                 *ptr_strides, *lstr, *tail, np.float32(attn_scale(p, attrs) * LOG2E), softcap,
                 table_stride, i32(tps)))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel
