"""Cost model of the CUDA matmul variants (see dnnctl/ops/costmodel.py).

cuBLAS runs at its measured throughput with its own tile choice, and pays a separate
epilogue pass (its product read back and rewritten with bias + activation) whenever the key
has a bias or an activation; our tiled kernels (mma, mma_atomic, simt, wgmma) fuse the
epilogue but store from fragments and pay split-K partials. A variant without an entry in
:data:`COSTS` is left to the fallback order in op.py; a new variant joins the model by adding
one here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import costmodel as cm

ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


def _sizes(p: Any) -> tuple[int, int, int, int, int]:
    return p["m"], p["n"], p["k"], p["batch"], ELEM[p["dtype"]]


def _epilogue(p: Any) -> bool:
    return bool(p["bias"]) or p["activation"] != "none"


def cublas(variant: Any, problem: Any, params: Mapping[str, Any],
           dev: cm.DeviceFacts) -> cm.Estimate:
    m, n, k, bt, eb = _sizes(problem)
    epi = _epilogue(problem)
    c_bytes = m * n * bt * eb
    cls = cm.cublas_class(problem["dtype"], problem["tf32"])
    compute, memory, waves = cm.cublas_us(m, n, k, bt, cls, dev,
                                          (m * k + k * n) * bt * eb + c_bytes, eb)
    extra, launches = 0.0, 1
    if epi:  # our in-place epilogue kernel: read y, write y
        extra = cm.pass_us(2 * c_bytes, dev)
        launches = 2
    return cm.total(variant.name, params, compute, memory, extra=extra, launches=launches,
                    waves=waves, notes=(cls, "separate epilogue" if epi else "no epilogue"))


def cublaslt(variant: Any, problem: Any, params: Mapping[str, Any],
             dev: cm.DeviceFacts) -> cm.Estimate:
    """cuBLAS's own kernels with bias / activation fused in the epilogue: the output is
    written once in the input dtype, in one launch (no fp32 product, no finish pass)."""
    m, n, k, bt, eb = _sizes(problem)
    cls = cm.cublas_class(problem["dtype"], problem["tf32"])
    compute, memory, waves = cm.cublas_us(m, n, k, bt, cls, dev,
                                          (m * k + k * n + m * n) * bt * eb, eb)
    return cm.total(variant.name, params, compute, memory, waves=waves,
                    notes=(cls, "fused epilogue" if _epilogue(problem) else "no epilogue"))


def _tiled(variant: Any, problem: Any, params: Mapping[str, Any], dev: cm.DeviceFacts,
           cls: str, family: str, bk: int) -> cm.Estimate:
    m, n, k, bt, eb = _sizes(problem)
    swap = bool(params.get("swap"))
    gm, gn = (n, m) if swap else (m, n)
    ktiles = cm.ceil_div(k, bk)
    per = cm.ceil_div(ktiles, max(1, params["splitk"]))
    splits = cm.ceil_div(ktiles, per)
    op_eb = 4 if problem["dtype"] == "float32" else eb
    smem = params["stages"] * (params["bm"] + params["bn"]) * bk * op_eb
    tile = cm.Tile(params["bm"], params["bn"], bk, params["warps"] * 32, smem, splits, family,
                   params["stages"])
    y = m * n * bt * eb
    partial = 0.0 if splits == 1 else 8.0 * splits * m * n * bt  # fp32 written + read back
    work = cm.GemmWork(gm, gn, k, bt, dram_bytes=(m * k + k * n) * bt * eb + y + partial,
                       a_bytes=gm * k * bt * eb, b_bytes=gn * k * bt * eb,
                       fragment_stores=m * n * bt)
    compute, memory, waves = cm.tiled_gemm_us(work, tile, cm.THROUGHPUT[cls], dev)
    launches = 1
    if splits > 1 and (params.get("reduce") == "separate" or variant.name == "mma_atomic"):
        launches = 2  # the finish kernel (or the zero fill of the atomic slab)
    return cm.total(variant.name, params, compute, memory, launches=launches, waves=waves,
                    notes=(cls, f"{gm}x{gn}x{k}x{bt} on {tile.bm}x{tile.bn}x{bk} sk{splits}"
                           + (" swapped" if swap else "")))


def mma(variant: Any, problem: Any, params: Mapping[str, Any],
        dev: cm.DeviceFacts) -> cm.Estimate:
    cls = "mma16" if problem["dtype"] != "float32" else "mma_tf32"
    return _tiled(variant, problem, params, dev, cls, "mma", params["bk"])


def simt(variant: Any, problem: Any, params: Mapping[str, Any],
         dev: cm.DeviceFacts) -> cm.Estimate:
    return _tiled(variant, problem, params, dev, "simt", "simt", params["bk"])


def wgmma(variant: Any, problem: Any, params: Mapping[str, Any],
          dev: cm.DeviceFacts) -> cm.Estimate:
    return _tiled(variant, problem, params, dev, "wgmma", "wgmma", 64)


COSTS: dict[str, cm.CostFn] = {
    "cublas": cublas, "cublaslt": cublaslt, "mma": mma, "mma_atomic": mma, "simt": simt,
    "wgmma": wgmma}
TILED = frozenset({"mma", "mma_atomic", "simt", "wgmma"})


def candidates(variant: Any, problem: Any, device: Any) -> list[dict[str, Any]]:
    """Tile menus (and the swapped skinny mode of wgmma) for our kernels; cuBLAS has no
    parameters."""
    own = getattr(variant, "default_params", None)
    try:
        default = own(problem, device) if own is not None else next(
            iter(variant.param_space(problem, device)), None)
    except Exception:  # a default the variant cannot form on this problem
        default = None
    if variant.name not in TILED:
        return [] if default is None else [dict(default)]
    out = cm.tile_candidates(variant, problem, device, default)
    if "swap" in variant.params and problem["m"] <= 64:
        for p in list(out):
            q = dict(p, swap=1 - p.get("swap", 0))
            if q not in out and cm.valid(variant, problem, q, device):
                out.append(q)
    return out


def rank(problem: Any, backend: str, device: Any) -> list[cm.Estimate]:
    """Every costed candidate of every supported variant, cheapest first."""
    from dnnctl.ops.registry import variants

    return cm.rank(variants("matmul", backend), problem, device, COSTS, candidates)


rank_memo = cm.memo_rank(rank)
