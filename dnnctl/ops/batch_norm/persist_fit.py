"""Whether a batch_norm training layer fits ``train_persist`` / ``bwd_persist`` (its tensors
staged in the shared memory of the blocks the GPU holds at once), their block shapes and the
op's default parameters for them: pure arithmetic on the key and the device, so the op's
default heuristic needs no variant module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
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


def staged_tensors(problem: Problem) -> int:
    """Tensors a thread stages per vector: x (forward); dy and x, and the residual of a
    fused relu(batch_norm(x) + z) (backward)."""
    if problem.get("pass", "forward") == "forward":
        return 1
    return 3 if problem.get("residual") else 2


def regs_bound(problem: Problem, vec: int, rows: int) -> int:
    """Registers a thread, from above: what ptxas gave for sm_90 (fp32 / fp16 / bf16, vec
    1-8, rows 2-24) was 32-78 forward and 32-104 backward; the bounds max(32 + 7 vec,
    40 + 2 rows) and max(32 + 10 vec, 48 + 2.5 rows), in the allocation's steps of 8."""
    if staged_tensors(problem) == 1:
        regs = max(32 + 7 * vec, 40 + 2 * rows)
    else:
        regs = max(32 + 10 * vec, 48 + 5 * rows // 2)
    return -(-regs // 8) * 8


@dataclass(frozen=True)
class Shape:
    """A persistent launch of one layer: ``threads`` a block, ``lanes`` channel vectors by
    ``rb`` rows, ``smem`` bytes of dynamic shared memory, ``grid`` (splits, tiles)."""

    threads: int
    lanes: int
    rb: int
    smem: int
    grid: tuple[int, int]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1]


def shape(problem: Problem, block: int, vec: int, rows: int) -> Shape | None:
    """The launch shape of ``problem`` at these parameters (None: no block shape)."""
    geo = geometry(problem["c"], vec, block)
    if geo is None:
        return None
    threads, lanes, rb = geo
    staged = staged_tensors(problem) * rows * threads * vec * dtype_size(problem["dtype"])
    smem = staged + (2 * threads * vec * 4 if rb > 1 else 0)  # then the fold's floats
    splits = mc.cdiv(problem["n"] * problem["h"] * problem["w"], rb * rows)
    return Shape(threads, lanes, rb, smem, (splits, problem["c"] // vec // lanes))


def resident_estimate(problem: Problem, sh: Shape, vec: int, rows: int) -> int:
    """Blocks one SM holds, estimated without compiling: shared memory and threads exactly,
    registers from :func:`regs_bound`; the build asks the driver."""
    regs = regs_bound(problem, vec, rows)
    return max(0, min(2048 // sh.threads, SMEM_PER_SM // (sh.smem + 1024),
                      REGS_PER_SM // (regs * sh.threads), 32))


def workspace_floats(problem: Problem, sh: Shape, out_floats: int) -> tuple[int, int]:
    """(floats of the split partials, of the whole workspace): the partials, the fold's
    ``out_floats`` of per-channel results, then the barrier's 64-bit counter."""
    part = sp.pad4(2 * problem["c"] * sh.grid[0])
    return part, part + out_floats + 4


def fits(problem: Problem, params: Mapping[str, Any], vec: int, device: Any) -> bool:
    """The layer's staged tensors fit in the blocks the GPU holds at once (estimate)."""
    sh = shape(problem, params["block"], vec, params["rows"])
    if sh is None or sh.smem > mc.smem_limit(device):
        return False
    return sh.blocks <= resident_estimate(problem, sh, vec, params["rows"]) * mc.sm_count(device)


def default_params(problem: Problem, device: Any) -> dict[str, Any] | None:
    """The default persistent parameters of an NHWC training problem, or None where its
    tensors do not fit: 256-thread blocks at the widest vector, and the fewest rows a thread
    stages that keep to one block per SM, else the fewest whose grid the GPU holds
    (estimated from above: the build asks the driver). One block per SM measured fastest
    (H100, 2026-12-07: 24 rows a thread 27.6 and 34.7 us forward / backward at 64 x 28 x 28
    x 128, 12 rows 29.7 and 41.6): fewer blocks to pass the grid barrier and fold."""
    if problem["layout"] != "NHWC" or not problem["training"]:
        return None
    vec = sp.best_vec(problem)
    held = None
    for rows in ROWS:
        params = {"block": 256, "vec": vec, "rows": rows}
        if fits(problem, params, vec, device):
            sh = shape(problem, 256, vec, rows)
            if sh is not None and sh.blocks <= mc.sm_count(device):
                return params
            held = params
    return held
