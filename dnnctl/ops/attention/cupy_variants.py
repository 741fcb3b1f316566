"""CUDA attention variants of ours: ``mma`` (FlashAttention-2 style, sm_80+) and ``decode``
(split-KV flash-decoding with GQA row packing), both kernels/attention/fwd_mma.cu.

``mma``: blocks of bm query rows (bm / 16 warps) of one head, key tiles of bn rows.
``decode``: a block's rows are (query, head) pairs of one key/value head's query-head group,
so each K / V tile is loaded once for the whole group; the key range is cut into ``splits``
slices whose fp32 partials ``attn_combine`` merges (log-sum-exp weighted).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.errors import ShapeError, UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.attention.op import CAUSAL, LOG2E, attn_scale, kv_pages
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant, unsupported
from dnnctl.ops.registry import register_variant

SOURCE = "attention/fwd_mma.cu"
HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)


def smem_bytes(p: Problem, bm: int, bn: int) -> int:
    """Q tile + double-buffered K and V tiles, rows padded by 16 bytes."""
    d, dv = p["head_dim"], p["head_dim_v"]
    return 2 * (bm * (d + 8) + 2 * bn * (d + 8) + 2 * bn * (dv + 8))


def strides(p: Problem) -> dict[str, tuple[int, int, int]]:
    """(batch, head, row) strides in elements of q, k, v, out; lse as (batch, head, 0)."""
    hq, hkv, sq, skv = p["heads_q"], p["heads_kv"], p["seq_q"], p["seq_kv"]
    out: dict[str, tuple[int, int, int]] = {}
    for name, h, s, d in (("q", hq, sq, p["head_dim"]), ("k", hkv, skv, p["head_dim"]),
                          ("v", hkv, skv, p["head_dim_v"]), ("out", hq, sq, p["head_dim_v"])):
        paged_kv = p["paged"] and name in ("k", "v")
        if p["varlen"] or paged_kv:
            out[name] = (0, d, h * d)
        elif p["layout"] == "BHSD":
            out[name] = (h * s * d, s * d, d)
        else:
            out[name] = (s * h * d, d, h * d)
    out["lse"] = (0, sq, 0) if p["varlen"] else (hq * sq, sq, 0)
    return out


def launch_strides(p: Problem) -> tuple[tuple[np.int64, ...], tuple[np.int64, np.int64]]:
    """The kernels' stride arguments: (batch, head, row) of q, k, v, out, then lse's two."""
    st = strides(p)
    return (tuple(np.int64(x) for n in ("q", "k", "v", "out") for x in st[n]),
            (np.int64(st["lse"][0]), np.int64(st["lse"][1])))


def require_aligned(inputs: Mapping[str, Any], names: tuple[str, ...]) -> None:
    """The mma-family kernels copy 16-byte chunks: an operand that does not start 16-byte
    aligned (a view at an odd element offset) is refused by name before any launch, not left
    to a misaligned-address fault that ends the CUDA context."""
    bad = [n for n in names if cuda.ptr(inputs[n]) & 15]
    if bad:
        raise ShapeError(f"attention: {', '.join(bad)} does not start at a 16-byte aligned "
                         "address (a view at an odd element offset)",
                         hint="pass a copy (tensor.clone())")


def _kv_tiles(p: Problem, bn: int) -> int:
    return -(-p["seq_kv"] // bn)


class CupyAttention(Variant):
    """Base of the attention variants on the cupy backend (ours and the vendors')."""

    op = "attention"
    backend = "cupy"


def mma_unsupported(p: Problem, device: Any, head_dims: tuple[int, ...],
                    built: str = "the kernel is built for") -> Support | None:
    """Why an mma.sync attention kernel (cp.async, bf16 mma: sm_80) compiled for
    ``head_dims`` cannot run ``p`` on ``device``, else None."""
    if device.cc_tuple < (8, 0):
        return unsupported(f"needs compute capability >= 8.0 (cp.async, bf16 mma); "
                           f"{device.name} is {device.compute_capability}")
    for f in ("head_dim", "head_dim_v"):
        if p[f] not in head_dims:
            return unsupported(f"{f}={p[f]}: {built} {list(head_dims)}")
    return None


class _FlashBase(CupyAttention):
    source = SOURCE
    pack = False

    def supports(self, problem: Problem, device: Any) -> Support:
        no = mma_unsupported(problem, device, HEAD_DIMS)
        return SUPPORTED if no is None else no

    def _regs_ok(self, p: Problem, bn: int, wm: int) -> bool:
        # fp32 accumulators per thread: O (dv / 2) + S (bn / 2) per m16 tile of the warp;
        # one tile spills above ~160, two (which load K / V once for both) above ~192
        acc = wm // 16 * (p["head_dim_v"] // 2 + bn // 2)
        return acc <= (160 if wm == 16 else 192)

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        limit = getattr(device, "smem_per_block_optin", 0) or 227 * 1024
        bm, bn, wm = params["bm"], params["bn"], params.get("wm", 16)
        if bm % wm or smem_bytes(problem, bm, bn) > limit or not self._regs_ok(problem, bn, wm):
            return False
        # no key tile twice the keys (only padding)
        return bn <= 32 or bn < 2 * -(-problem["seq_kv"] // 16) * 16

    def _defines(self, p: Problem, params: Mapping[str, Any], splits: int) -> dict[str, int]:
        return {"DNNCTL_DTYPE": codes.DTYPE[p["dtype"]], "ATT_D": p["head_dim"],
                "ATT_DV": p["head_dim_v"], "ATT_BM": params["bm"], "ATT_BN": params["bn"],
                "ATT_WM": params.get("wm", 16), "ATT_MASK": CAUSAL.index(p["causal"]), "ATT_SOFTCAP": int(p["softcap"] > 0),
                "ATT_VARLEN": int(p["varlen"]), "ATT_PAGED": p["paged"],
                "ATT_PACK": int(self.pack), "ATT_SPLITS": splits}

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        s = params.get("splits", 1)
        if s <= 1:
            return 0
        p = problem
        return 4 * s * p["batch"] * p["heads_q"] * p["seq_q"] * (p["head_dim_v"] + 1)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        if not self.supports(problem, device) or not self.valid_params(problem, params, device):
            raise UnsupportedError(f"attention/{self.name}: {dict(params)} not legal here")
        return FlashKernel(problem, dict(params), self._defines(
            problem, params, params.get("splits", 1)), self.pack)


class FlashKernel:
    """Launcher of attn_fwd (and attn_combine for split-KV)."""

    flat_io = True  # pointers only

    def __init__(self, p: Problem, params: dict[str, Any], defines: dict[str, int],
                 pack: bool) -> None:
        be = get_backend("cupy")
        self.xp = be.xp
        mod = be.compile_module(SOURCE, defines=defines)
        self.fn = mod.get_function("attn_fwd")
        self.smem = smem_bytes(p, params["bm"], params["bn"])
        if self.smem > 48 * 1024:
            self.fn.max_dynamic_shared_size_bytes = self.smem
        self.splits = params.get("splits", 1)
        self.p, self.bm, self.bn = p, params["bm"], params["bn"]
        g = p["heads_q"] // p["heads_kv"]
        rows = p["seq_q"] * g if pack else p["seq_q"]
        mblocks = -(-rows // self.bm)
        self.grid = (mblocks * self.splits, p["heads_kv"] if pack else p["heads_q"], p["batch"])
        self.block = (self.bm // params.get("wm", 16) * 32, 1, 1)
        # launched through the CUDA seam: torch CUDA tensors (the dispatcher's flat path)
        # go by data_ptr on the call's stream, as every other op's arrays
        self.fwd = cuda.Launch(self.fn, self.grid, self.block, self.smem)
        nrows = p["batch"] * p["heads_q"] * p["seq_q"]
        self.combine = (cuda.Launch(mod.get_function("attn_combine"), (-(-nrows // 4), 1, 1),
                                    (128, 1, 1)) if self.splits > 1 else None)
        self.tps = -(-_kv_tiles(p, self.bn) // self.splits)
        self.strides, self.lse_strides = launch_strides(p)
        self.table_stride = np.int32(kv_pages(p))
        self.group = np.int32(g)

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        p = self.p
        require_aligned(inputs, ("q", "k", "v"))
        scale_log2 = np.float32(attn_scale(p, attrs) * LOG2E)
        ws_o = ws_lse = None
        nrows = p["batch"] * p["heads_q"] * p["seq_q"]
        if self.splits > 1:
            ws_o = cuda.scratch((self.splits * nrows * p["head_dim_v"],), dtype=np.float32)
            ws_lse = cuda.scratch((self.splits * nrows,), dtype=np.float32)
        self.fwd((
            inputs["q"], inputs["k"], inputs["v"], outputs["out"], outputs["lse"], ws_o, ws_lse,
            inputs.get("cu_seqlens_q"), inputs.get("cu_seqlens_k"), inputs.get("block_table"),
            inputs.get("seqused_k"), *self.strides, *self.lse_strides, np.int32(p["seq_q"]),
            np.int32(p["seq_kv"]), np.int32(p["heads_q"]), self.group, np.int32(p["window"]),
            scale_log2, np.float32(p["softcap"]), self.table_stride, np.int32(self.tps)))
        if self.combine is not None:
            ost = self.strides[9:12]
            self.combine((
                ws_o, ws_lse, outputs["out"], outputs["lse"], np.int32(p["batch"]),
                np.int32(p["heads_q"]), np.int32(p["seq_q"]), np.int32(self.splits), *ost,
                *self.lse_strides))


@register_variant
class MmaAttention(_FlashBase):
    """FlashAttention-2-style forward on mma.sync."""

    name = "mma"
    params = {"bm": (64, 128), "bn": (32, 64, 128), "wm": (16, 32)}
    doc = ("flash attention forward on mma.sync m16n8k16 (sm_80+): cp.async double buffer, "
           "online softmax, masks / window / softcap / GQA / varlen / paged KV")

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        p = problem
        dv = p["head_dim_v"]
        bm = 128 if p["seq_q"] > 64 else 64
        wm = 32 if dv <= 128 and bm == 128 else 16
        bn = 64 if dv <= 64 or (wm == 16 and dv <= 128) else 32
        params = {"bm": bm, "bn": bn, "wm": wm}
        return self.first_valid(p, device, [params])


@register_variant
class DecodeAttention(_FlashBase):
    """Split-KV flash-decoding with the query heads of a GQA group packed as rows."""

    name = "decode"
    pack = True
    params = {"bm": (16, 32, 64), "bn": (32, 64, 128), "splits": (1, 2, 4, 8, 16, 32)}
    doc = ("split-KV flash-decoding (sm_80+): GQA groups packed into the rows of one block "
           "(each K/V tile read once per group), fp32 partials merged by a combine kernel; "
           "paged KV cache")

    def supports(self, problem: Problem, device: Any) -> Support:
        ok = super().supports(problem, device)
        if not ok:
            return ok
        p = problem
        rows = p["seq_q"] * (p["heads_q"] // p["heads_kv"])
        if p["varlen"]:
            return unsupported("decode takes fixed-length queries (varlen: use mma)")
        if rows > 64:
            return unsupported(f"{rows} query rows per kv head (seq_q x group) exceed the "
                               "decode kernel's 64; use mma")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        p = problem
        rows = p["seq_q"] * (p["heads_q"] // p["heads_kv"])
        if params["bm"] > 16 and params["bm"] >= 2 * rows:
            return False
        if params["splits"] > 1 and params["splits"] * 2 > _kv_tiles(p, params["bn"]):
            return False  # a split reads at least two key tiles
        return super().valid_params(problem, params, device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        p = problem
        rows = p["seq_q"] * (p["heads_q"] // p["heads_kv"])
        bm = 16 if rows <= 16 else (32 if rows <= 32 else 64)
        bn = 64 if p["head_dim_v"] <= 128 else 32
        blocks = p["batch"] * p["heads_kv"] * -(-rows // bm)
        sms = getattr(device, "sm_count", 0) or 132
        splits = 1
        while (splits < 32 and blocks * splits < 2 * sms
               and 2 * splits * 2 <= _kv_tiles(p, bn)):
            splits *= 2
        params = {"bm": bm, "bn": bn, "splits": splits}
        return self.first_valid(p, device, [params])

