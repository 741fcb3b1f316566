"""matmul ``wgmma_tma``: the Hopper GEMM fed by TMA (kernels/gemm/wgmma_tma.cu, sm_90a).

Warp-specialized: one producer warpgroup issues ``cp.async.bulk.tensor`` copies of 128-byte
swizzled boxes into a ring of shared-memory stages (mbarrier full / empty pairs), one or
two consumer warpgroups run ``wgmma.mma_async`` on them (``setmaxnreg`` moves registers to
the consumers when there are two); the grid is persistent (one block per SM walking the
output tiles), and the epilogue (bias, activation) goes through shared memory to 16-byte
stores. Every trans_a / trans_b combination runs without a copy (K-major or MN-major boxes).

Parameters: bm, bn (block tile), consumers (warpgroups computing it: each owns bm /
consumers rows), stages. Limits the copy engine sets, checked by ``supports()``: the stored
operands' leading dimensions are multiples of 8 elements (16-byte strides). A call whose
``a`` or ``b`` is not 16-byte aligned (a view at an odd offset) runs the ``wgmma`` kernel
(cp.async loads) instead, built on first need. The tensor maps hold the operands' addresses,
so they are encoded per address on the host (memoized, dnnctl/backends/tma.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda, tma
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops.base import Kernel, LazyKernel, Problem, Support, unsupported
from dnnctl.ops.matmul.cupy_variants import CupyMatmul
from dnnctl.ops.matmul.gemm_launch import DEFAULT_SMEM_OPTIN, DTYPE_CODES
from dnnctl.ops.matmul.op import ACT_CODES
from dnnctl.ops.matmul.wgmma import tma_device_ok
from dnnctl.ops.registry import register_variant

BK = 64
STAGING_BYTES = 64 * 40 * 4  # per consumer warpgroup: a 64 x 32 fp32 chunk, rows padded
TMA_SPACE: dict[str, tuple[Any, ...]] = {
    "bm": (64, 128, 256), "bn": (64, 128, 256), "consumers": (1, 2), "stages": (3, 4, 5, 6)}


def tma_smem_bytes(params: Mapping[str, Any]) -> int:
    """Dynamic shared memory: the ring, the staging chunks, the barriers, 1 KB alignment."""
    bm, bn, stages = params["bm"], params["bn"], params["stages"]
    return stages * (bm + bn) * BK * 2 + params["consumers"] * STAGING_BYTES + 16 * stages + 1024


def tma_tile_ok(params: Mapping[str, Any], device: Any) -> bool:
    """Each consumer owns whole m64 slices and at most 128 fp32 accumulators per thread;
    the ring fits the block's shared memory."""
    bm, bn, cons = params["bm"], params["bn"], params["consumers"]
    if bm % (64 * cons):
        return False
    if (bm // (64 * cons)) * bn // 2 > 128:
        return False
    limit = getattr(device, "smem_per_block_optin", 0) or DEFAULT_SMEM_OPTIN
    return tma_smem_bytes(params) <= limit


def tma_heuristic(m: int, n: int, k: int, batch: int, device: Any) -> dict[str, Any]:
    """128 x 256 tiles (two consumers of 64 x 256) with 4 stages when that fills the GPU;
    128 x 128 with 6 stages when it does not; 64-row tiles with one consumer for M <= 64."""
    sms = getattr(device, "sm_count", 0) or 132
    if m <= 64:
        return {"bm": 64, "bn": 128 if n > 64 else 64, "consumers": 1, "stages": 6}
    if n <= 64:
        return {"bm": 128, "bn": 64, "consumers": 2, "stages": 6}
    if n > 128 and -(-m // 128) * -(-n // 256) * batch >= sms:
        return {"bm": 128, "bn": 256, "consumers": 2, "stages": 4}
    return {"bm": 128, "bn": 128, "consumers": 2, "stages": 6}


def map_specs(p: Problem, params: Mapping[str, Any]) -> tuple[tma.MapSpec, tma.MapSpec]:
    """The tensor maps of a problem's a and b (stored layouts) for a tile."""
    m, n, k, bt, dt = p["m"], p["n"], p["k"], p["batch"], p["dtype"]
    if p["trans_a"]:  # stored (k, m): M contiguous, 64 x 64 boxes
        sa = tma.operand_spec(dt, inner=m, outer=k, ld=m, batch=bt, batch_stride=m * k,
                              box=(64, 64))
    else:
        sa = tma.operand_spec(dt, inner=k, outer=m, ld=k, batch=bt, batch_stride=m * k,
                              box=(BK, params["bm"]))
    if p["trans_b"]:  # stored (n, k): K contiguous
        sb = tma.operand_spec(dt, inner=k, outer=n, ld=k, batch=bt, batch_stride=n * k,
                              box=(BK, params["bn"]))
    else:
        sb = tma.operand_spec(dt, inner=n, outer=k, ld=n, batch=bt, batch_stride=n * k,
                              box=(64, 64))
    return sa, sb


def tma_defines(p: Problem, params: Mapping[str, Any]) -> dict[str, int]:
    return {"DNNCTL_DTYPE": DTYPE_CODES[p["dtype"]], "GEMM_BM": params["bm"],
            "GEMM_BN": params["bn"], "GEMM_CONS": params["consumers"],
            "GEMM_STAGES": params["stages"], "GEMM_A_KMAJOR": int(not p["trans_a"]),
            "GEMM_B_KMAJOR": int(p["trans_b"]), "EPI_ACT": ACT_CODES[p["activation"]],
            "EPI_BIAS": int(p["bias"]), "EPI_RES": 0}


@register_variant
class WgmmaTmaMatmul(CupyMatmul):
    """Hopper GEMM: TMA producer warpgroup, wgmma consumers, persistent grid, staged
    epilogue."""

    name = "wgmma_tma"
    source = "gemm/wgmma_tma.cu"
    params = TMA_SPACE
    doc = ("Hopper GEMM (fp16/bf16, sm_90a): TMA loads into an mbarrier ring, producer + "
           "1-2 wgmma consumer warpgroups, persistent grid, smem-staged fused epilogue")

    def supports(self, problem: Problem, device: Any) -> Support:
        p = problem
        lda = p["m"] if p["trans_a"] else p["k"]
        ldb = p["k"] if p["trans_b"] else p["n"]
        if lda % 8 or ldb % 8:
            return unsupported(f"TMA needs 16-byte row strides: the stored a / b rows are "
                               f"{lda} / {ldb} elements (multiples of 8 needed)")
        return tma_device_ok(p["dtype"], device, p["m"], p["n"], p["k"], p["batch"])

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if not tma_tile_ok(params, device):
            return False
        m, n = problem["m"], problem["n"]
        if params["bm"] > 64 and params["bm"] >= 2 * -(-m // 64) * 64:
            return False  # a tile twice the problem
        return not (params["bn"] > 64 and params["bn"] >= 2 * -(-n // 64) * 64)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        p = problem
        params = tma_heuristic(p["m"], p["n"], p["k"], p["batch"], device)
        return self.first_valid(p, device, [params])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        if not tma_tile_ok(params, device):
            raise UnsupportedError(f"matmul/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        maps_a, maps_b = (tma.MapCache(s) for s in map_specs(p, params))
        smem = tma_smem_bytes(params)
        mod = get_backend("cupy").compile_module(self.source, defines=tma_defines(p, params))
        m, n, k, bt = p["m"], p["n"], p["k"], p["batch"]
        tiles = -(-m // params["bm"]) * -(-n // params["bn"]) * bt
        sms = getattr(device, "sm_count", 0) or 132
        run = cuda.launch(mod, "gemm_tma_kernel", (min(tiles, sms), 1, 1),
                          (128 * (params["consumers"] + 1), 1, 1), smem)
        i32, i64 = np.int32, np.int64
        tail = (i32(m), i32(n), i32(k), i64(n), i64(m * n), i64(0), i32(bt))
        ptr = cuda.ptr
        fallback = LazyKernel(lambda: _cp_async_kernel(p, device))

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            pa, pb = ptr(inputs["a"]), ptr(inputs["b"])
            if (pa | pb) & 15:  # the copy engine needs 16-byte aligned bases
                fallback(inputs, outputs, attrs)
                return
            run((maps_a(pa), maps_b(pb), outputs["y"], inputs.get("bias"), None, *tail))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel


def _cp_async_kernel(p: Problem, device: Any) -> Kernel:
    """The ``wgmma`` variant's kernel (cp.async loads, no alignment needs), no split-K."""
    from dnnctl.ops.matmul.wgmma import WgmmaMatmul, wg_heuristic

    params = wg_heuristic(p["m"], p["n"], p["k"], p["batch"], device)
    return WgmmaMatmul().build(p, dict(params, splitk=1, reduce="fused", swap=0), device)
