"""matmul ``wgmma``: the Hopper tensor-core GEMM (kernels/gemm/wgmma.cu, sm_90a only).

Warpgroup-level ``wgmma.mma_async`` m64nNk16 (fp16 / bf16 in, fp32 accumulate) with both
operands read from shared memory through matrix descriptors in the 128-byte swizzled
canonical layouts (K-major or MN-major, so every trans_a / trans_b combination runs without a
copy), a cp.async multi-stage ring of 64-deep k-tiles, one or two consumer warpgroups, and the
same fused epilogue and split-K semantics as ``mma`` (deterministic: fused in-kernel or a
separate finish kernel). Parameters: block tile bm x bn (bk is 64), warps (4 per warpgroup),
stages, splitk, reduce, and swap: 1 computes C^T = B^T A^T (for M <= 64: the weights fill the
64-row wgmma M side, the few tokens its N of 16 / 32 / 64, no tensor work on padding rows),
storing C transposed from the accumulators.

Shared by conv2d ``implicit_gemm_wgmma`` (dnnctl/ops/conv2d/implicit_gemm.py) through
:func:`wg_tile` and :func:`wg_space_ok`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.backends import tma
from dnnctl.errors import UnsupportedError
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.matmul.cupy_variants import CupyMatmul, matmul_desc
from dnnctl.ops.matmul.gemm_launch import (
    MATH_WGMMA,
    MAX_GRID_Z,
    GemmKernel,
    TileConfig,
    counter_elems,
    make_gemm,
    split_plan,
    swapped,
    tile_ok,
    workspace_elems,
)
from dnnctl.ops.registry import register_variant

WG_BK = 64
WG_SPACE: dict[str, tuple[Any, ...]] = {
    "bm": (64, 128, 256), "bn": (16, 32, 64, 128, 256), "bk": (WG_BK,), "warps": (4, 8),
    "stages": (3, 4, 5, 6), "splitk": (1, 2, 4, 8, 16)}


def wgmma_device_ok(dtype: str, device: Any) -> Support:
    """wgmma exists on sm_90 only (sm_90a code; Blackwell has tcgen05 instead)."""
    cc = getattr(device, "cc_tuple", (0, 0))
    if cc != (9, 0):
        return unsupported(f"wgmma is an sm_90a instruction (Hopper); {getattr(device, 'name', '?')}"
                           f" is compute capability {getattr(device, 'compute_capability', '?')}")
    if dtype not in ("float16", "bfloat16"):
        return unsupported(f"the wgmma kernels take float16 / bfloat16, not {dtype}")
    return SUPPORTED


def tma_device_ok(dtype: str, device: Any, *sizes: int) -> Support:
    """wgmma_device_ok, a driver that encodes tensor maps, and ``sizes`` (the largest
    coordinates a kernel computes) within the 32 bits TMA coordinates have."""
    ok = wgmma_device_ok(dtype, device)
    if not ok:
        return ok
    if max(sizes, default=0) >= 2**31:
        return unsupported("sizes must fit 32-bit coordinates")
    if not tma.available():
        return unsupported("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a "
                           "CUDA 12+ driver)")
    return SUPPORTED


def wg_tile(params: Mapping[str, Any]) -> TileConfig | None:
    """The TileConfig of wgmma parameters: warps / 4 warpgroups split bm in m64 slices; at most
    128 fp32 accumulators per thread; None when illegal."""
    warps, bm, bn = params["warps"], params["bm"], params["bn"]
    if warps % 4 or params["bk"] != WG_BK:
        return None
    wgs = warps // 4
    if bm % (64 * wgs) or (bm // (64 * wgs)) * bn // 2 > 128:
        return None
    return TileConfig(MATH_WGMMA, bm, bn, WG_BK, warps, 1, params["stages"])


def wg_space_ok(params: Mapping[str, Any], dtype: str, m: int, n: int, k: int, batch: int,
                device: Any, b_kmajor: bool = True) -> bool:
    """A legal tile (registers, shared memory) that makes sense for an M x N x K product: no
    tile twice the problem, split-K only while the grid underfills the GPU with at least two
    k-tiles per split, no more prefetch than k-tiles. An MN-major B (``b_kmajor`` false) is
    stored in 64-wide swizzle blocks, so its bn is a multiple of 64."""
    cfg = wg_tile(params)
    if cfg is None or not tile_ok(cfg, dtype, device):
        return False
    if not b_kmajor and cfg.bn % 64:
        return False
    if cfg.bm > 64 and cfg.bm >= 2 * -(-m // 64) * 64:
        return False
    if cfg.bn > 16 and cfg.bn >= 2 * -(-n // 16) * 16:
        return False
    if cfg.bn < 64 and n >= 64:
        return False  # narrow tiles only where N itself is narrow
    sms = getattr(device, "sm_count", 0) or 132
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
    ktiles = -(-k // WG_BK)
    splitk = params["splitk"]
    if splitk > 1:
        if ktiles < 2 * splitk or tiles >= sms or batch * splitk > MAX_GRID_Z:
            return False
        if split_plan(k, WG_BK, splitk)[1] != splitk:
            return False
    per_split = -(-ktiles // splitk)
    return cfg.stages == 3 or cfg.stages - 2 <= per_split


def _split_for_waves(tiles: int, ktiles: int, sms: int, max_split: int) -> int:
    """The split count whose blocks fill the last wave best (ties: fewer splits), splitting
    only an under-filled grid and keeping at least 4 k-tiles per split."""
    best, best_eff = 1, tiles / (-(-tiles // sms) * sms)
    if tiles >= sms:
        return 1
    s = 2
    while s <= max_split and ktiles >= 4 * s:
        blocks = tiles * s
        eff = blocks / (-(-blocks // sms) * sms)
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
        s *= 2
    return best


def wg_heuristic(m: int, n: int, k: int, batch: int, device: Any,
                 allow_swap: bool = False) -> dict[str, Any]:
    """128 x 256 tiles with two warpgroups and 4 stages on big products (the tile that keeps
    L2 -> SM traffic below what the tensor cores eat); 128 x 128 when the tile grid is small
    (m <= 256, or under one wave of 128 x 256 tiles); 64-row tiles
    with one warpgroup and 6 stages for M <= 64 (bandwidth-bound: loads in flight), or with
    ``allow_swap`` and M <= 32 the swapped product (128 rows of B^T x 16 / 32 of A^T per
    block). Split-K to fill the last wave of blocks (at most 4 slabs per tile for 128-row
    tiles, whose finish is one block reading them all; 8 for 64-row tiles)."""
    sms = getattr(device, "sm_count", 0) or 132
    if allow_swap and m <= 32:
        bn = 16 if m <= 16 else 32
        tiles = -(-n // 128) * -(-m // bn) * batch
        splitk = _split_for_waves(tiles, -(-k // WG_BK), sms, 8)
        return {"bm": 128, "bn": bn, "bk": WG_BK, "warps": 4, "stages": 6, "splitk": splitk,
                "swap": 1}
    if m <= 64:
        bm, warps, stages, max_split = 64, 4, 6, 8
        bn = 128 if n >= 128 else 64
    elif m <= 256:
        bm, warps, max_split = 128, 8, 4
        bn = 128 if n >= 128 else 64
        stages = 5
    else:
        bm, warps, max_split = 128, 8, 4
        bn = 256 if n >= 256 else (128 if n >= 128 else 64)
        if bn == 256 and -(-m // bm) * -(-n // bn) * batch < sms:
            bn = 128  # a grid under one wave: twice the tiles before splitting K
        stages = 4 if bn == 256 else 5
    tiles = -(-m // bm) * -(-n // bn) * batch
    splitk = _split_for_waves(tiles, -(-k // WG_BK), sms, max_split)
    out = {"bm": bm, "bn": bn, "bk": WG_BK, "warps": warps, "stages": stages,
           "splitk": splitk}
    if allow_swap:
        out["swap"] = 0
    return out


@register_variant
class WgmmaMatmul(CupyMatmul):
    """Hopper wgmma GEMM with the fused epilogue and deterministic split-K."""

    name = "wgmma"
    source = "gemm/wgmma.cu"
    params = {**WG_SPACE, "reduce": ("fused", "separate"), "swap": (0, 1)}
    doc = ("Hopper wgmma.mma_async GEMM (fp16/bf16, sm_90a): swizzled smem descriptors, "
           "cp.async ring, 1-2 warpgroups, fused bias+activation, deterministic split-K")

    def supports(self, problem: Problem, device: Any) -> Support:
        ok = wgmma_device_ok(problem["dtype"], device)
        if not ok:
            return ok
        if problem["batch"] > MAX_GRID_Z:
            return unsupported(f"batch {problem['batch']} exceeds the grid limit {MAX_GRID_Z}")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        p = problem
        if params.get("reduce") == "separate" and params["splitk"] == 1:
            return False  # nothing to reduce
        m, n, b_kmajor = p["m"], p["n"], p["trans_b"]
        if params.get("swap"):
            if m > 64:
                return False  # a skinny-product mode
            m, n, b_kmajor = n, m, not p["trans_a"]  # the kernel's B is the product's a
        return wg_space_ok(params, p["dtype"], m, n, p["k"], p["batch"], device, b_kmajor)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        p = problem
        params = wg_heuristic(p["m"], p["n"], p["k"], p["batch"], device, allow_swap=True)
        params["reduce"] = "fused"
        return self.first_valid(p, device, [params])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        desc = matmul_desc(problem)
        if params.get("swap"):
            desc = swapped(desc)
        slabs = workspace_elems(desc, WG_BK, params["splitk"], False)
        counters = 0
        if slabs and params.get("reduce") == "fused":
            counters = counter_elems(desc, params["bm"], params["bn"])
        return 4 * (slabs + counters)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        cfg = wg_tile(params)
        if cfg is None or not tile_ok(cfg, problem["dtype"], device):
            raise UnsupportedError(f"matmul/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        swap = bool(params.get("swap"))
        desc = swapped(matmul_desc(problem)) if swap else matmul_desc(problem)
        return GemmKernel(make_gemm(desc, cfg, params["splitk"], False, device,
                                    fused=params.get("reduce") == "fused", swap=swap))
