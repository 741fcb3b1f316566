"""Whether a batch_norm training layer fits ``train_persist`` / ``bwd_persist`` (its tensors
staged in the shared memory of the blocks the GPU holds at once), their block shapes and the
op's default parameters for them: pure arithmetic on the key and the device, so the op's
default heuristic needs no variant module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Problem, dtype_size

BLOCKS = (256, 512)  # the variants' ``block`` parameter: threads a block, about
ROWS = (2, 4, 8, 12, 16, 24)  # ``rows``: vectors of each tensor a thread stages
SMEM_PER_SM = 228 * 1024  # Hopper's shared memory per SM (227 KB a block, 1 KB reserved each)
REGS_PER_SM = 65536
# a misaligned call's scalar program: train_lastblock at the op's default parameters
SAFE = {"block": 256, "vec": 1, "unroll": 8, "blocks_per_sm": 2, "tile": 128}


def geometry(c: int, vec: int, block: int) -> tuple[int, int, int] | None:
    """(threads a block, channel-vector lanes L, rows RB a block covers at once) for ``c``
    channels in ``vec``-wide vectors and about ``block`` threads: whole warps, whole channel
    tiles (L divides the block and the channel vectors); None where no block of at most 1024
    threads has that shape."""
    if c % vec or c < vec:
        return None
    cv = c // vec
    if cv <= 1024:
        base = cv * 32 // math.gcd(cv, 32)  # lcm(cv, 32): whole warps of whole rows
        if base > 1024:
            return None
        threads = base * max(1, min(block, 1024) // base)
    else:
        fits = [b for b in (1024, 512, 256, 128, 64, 32) if cv % b == 0]
        if not fits:
            return None
        threads = min(fits, key=lambda b: (abs(b - block), -b))
    lanes = min(cv, threads)
    return threads, lanes, threads // lanes


def smem_bytes(problem: Problem, threads: int, rb: int, vec: int, rows: int) -> int:
    """Dynamic shared memory of a block: its staged vectors, then the fold's floats."""
    staged = rows * threads * vec * dtype_size(problem["dtype"])
    return staged + (2 * threads * vec * 4 if rb > 1 else 0)


def splits(problem: Problem, rb: int, rows: int) -> int:
    """Blocks along the rows: each covers rb rows ``rows`` times."""
    return mc.cdiv(problem["n"] * problem["h"] * problem["w"], rb * rows)


def resident_estimate(threads: int, smem: int, vec: int, rows: int) -> int:
    """Blocks one SM holds, estimated without compiling: shared memory and threads exactly,
    registers from a bound above what ptxas gave for sm_90 (fp32 / fp16, vec 1-8, rows
    2-24: 32-78 registers a thread; the bound max(32 + 7 vec, 40 + 2 rows)); the build asks
    the driver."""
    regs = -(-max(32 + 7 * vec, 40 + 2 * rows) // 8) * 8
    return max(0, min(2048 // threads, SMEM_PER_SM // (smem + 1024),
                      REGS_PER_SM // (regs * threads), 32))


def fits(problem: Problem, params: Mapping[str, Any], vec: int, device: Any) -> bool:
    """The layer fits in the blocks the GPU holds at once (estimate)."""
    geo = geometry(problem["c"], vec, params["block"])
    if geo is None:
        return False
    threads, lanes, rb = geo
    smem = smem_bytes(problem, threads, rb, vec, params["rows"])
    if smem > mc.smem_limit(device):
        return False
    blocks = splits(problem, rb, params["rows"]) * (problem["c"] // vec // lanes)
    return blocks <= resident_estimate(threads, smem, vec, params["rows"]) * mc.sm_count(device)


def default_params(problem: Problem, device: Any) -> dict[str, Any] | None:
    """The op's default train_persist parameters for an NHWC training problem, or None
    where x does not fit: 256-thread blocks at the widest vector, and the fewest rows a
    thread stages (the most blocks, so the most bytes in flight) whose grid the GPU holds
    (estimated from above: the build asks the driver)."""
    if problem["layout"] != "NHWC" or not problem["training"]:
        return None
    vec = sp.best_vec(problem)
    for rows in ROWS:
        params = {"block": 256, "vec": vec, "rows": rows}
        geo = geometry(problem["c"], vec, 256)
        if geo is None:
            return None
        threads, lanes, rb = geo
        smem = smem_bytes(problem, threads, rb, vec, rows)
        if smem > mc.smem_limit(device):
            return None
        blocks = splits(problem, rb, rows) * (problem["c"] // vec // lanes)
        if blocks <= resident_estimate(threads, smem, vec, rows) * mc.sm_count(device):
            return params
    return None


# ----------------------------------------------------------------------------- backward


def bwd_staged(problem: Problem) -> int:
    """Tensors the backward stages per vector: dy and x, and the residual of a fused
    relu(batch_norm(x) + z)."""
    return 3 if problem.get("residual") else 2


def bwd_smem_bytes(problem: Problem, threads: int, rb: int, vec: int, rows: int) -> int:
    staged = bwd_staged(problem) * rows * threads * vec * dtype_size(problem["dtype"])
    return staged + (2 * threads * vec * 4 if rb > 1 else 0)


def bwd_fits(problem: Problem, params: Mapping[str, Any], vec: int, device: Any) -> bool:
    """dy and x (and z) fit in the blocks the GPU holds at once (estimate)."""
    geo = geometry(problem["c"], vec, params["block"])
    if geo is None:
        return False
    threads, lanes, rb = geo
    smem = bwd_smem_bytes(problem, threads, rb, vec, params["rows"])
    if smem > mc.smem_limit(device):
        return False
    blocks = splits(problem, rb, params["rows"]) * (problem["c"] // vec // lanes)
    return blocks <= resident_estimate(threads, smem, vec, params["rows"]) * mc.sm_count(device)


def bwd_default_params(problem: Problem, device: Any) -> dict[str, Any] | None:
    """The default bwd_persist parameters of an NHWC backward key (as :func:`default_params`),
    or None where dy and x do not fit."""
    if problem["layout"] != "NHWC":
        return None
    vec = sp.best_vec(problem)
    for rows in ROWS:
        params = {"block": 256, "vec": vec, "rows": rows}
        if bwd_fits(problem, params, vec, device):
            return params
    return None
