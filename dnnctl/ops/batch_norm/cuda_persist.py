"""batch_norm training forward in one cooperative launch: ``train_persist`` (NHWC).

Every block stages its rows of x in shared memory (cp.async), sums them, and waits at a
grid-wide barrier; the grid's warps fold the per-block partials (a warp per channel, fixed
order) and write the statistics; after a second barrier each block normalizes the x it
still holds (kernels/norm/bn_persist.cu). x is read from memory once instead of twice, and
one launch replaces two: what the small and mid-sized layers of a ResNet lose to launch,
tail and fold latency.

All blocks must be resident at once, so the launch is cooperative
(cuLaunchCooperativeKernel) and the grid is sized from the driver's occupancy calculator:
a layer fits when its x fits in the shared memory of the blocks the GPU holds (about 30 MB on
an H100 / H200 at one 512-thread block per SM). Larger layers, NCHW and a misaligned call's
scalar program run ``train_lastblock``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import KernelLaunchError, UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.batch_norm.cuda_onepass import BnTrainLastBlock
from dnnctl.ops.batch_norm.cuda_variants import _BnCuda, _BnKernel
from dnnctl.ops.registry import register_variant

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
    for rows in BnTrainPersist.params["rows"]:
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


class _PersistKernel(_BnKernel):
    """The cooperative program when x / y (and a residual) are aligned to its vector width,
    else train_lastblock's scalar program."""


@register_variant
class BnTrainPersist(_BnCuda):
    name = "train_persist"
    fused_epilogue = True
    source = "norm/bn_persist.cu"
    training = True
    doc = ("one cooperative launch, x read once: blocks stage x in shared memory, sum, "
           "grid barrier, a warp per channel folds, grid barrier, normalize from shared "
           "memory (NHWC layers that fit on chip)")
    # rows: vectors of x a thread stages (the block's share of x in shared memory)
    params = {"block": (256, 512), "vec": mc.VECS, "rows": (2, 4, 8, 12, 16, 24)}

    def supports(self, problem: Problem, device: Any) -> Support:
        base = _BnCuda.supports(self, problem, device)
        if not base:
            return base
        if problem["layout"] != "NHWC":
            return unsupported("NHWC only (NCHW: train_lastblock)")
        if not any(fits(problem, {"block": b, "rows": r}, v, device)
                   for b in self.params["block"] for r in self.params["rows"]
                   for v in mc.VECS if sp.vec_ok(problem, v)):
            return unsupported("x does not fit in the shared memory of the blocks the GPU "
                               "holds at once (train_lastblock reads it twice)")
        return base

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"]) and fits(problem, params, params["vec"],
                                                          device)

    def planned_vec(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        if not self.valid_params(problem, params, device):
            raise UnsupportedError(f"batch_norm/{self.name}: {dict(params)} does not fit "
                                   "this layer on this GPU")
        return params["vec"]

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        geo = geometry(problem["c"], params["vec"], params["block"])
        if geo is None:
            return 0
        threads, lanes, rb = geo
        s = splits(problem, rb, params["rows"])
        return 4 * (sp.pad4(2 * problem["c"] * s) + sp.pad4(problem["c"]) + 4)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = self.planned_vec(problem, params, device)
        fast = self.program(problem, params, vec, device)
        safe = BnTrainLastBlock().program(problem, SAFE, 1, device)
        return _PersistKernel(fast, safe, vec * dtype_size(problem["dtype"]), True)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        c = problem["c"]
        geo = geometry(c, vec, params["block"])
        if geo is None:
            raise UnsupportedError(f"batch_norm/{self.name}: no block shape for {c} channels "
                                   f"in {vec}-wide vectors")
        threads, lanes, rb = geo
        rows = params["rows"]
        name = f"bn_persist_rows<{threads},{vec},{rows}>"
        mod = mc.compile_cuda(self.source, {**self.defines(problem, 1), "CH": c}, [name],
                              device)
        smem = smem_bytes(problem, threads, rb, vec, rows)
        grid = (splits(problem, rb, rows), c // vec // lanes)
        held = mc.cuda.max_active_blocks(mod, name, threads, smem)
        if held is None:
            held = resident_estimate(threads, smem, vec, rows)
        if grid[0] * grid[1] > held * mc.sm_count(device):
            raise UnsupportedError(
                f"batch_norm/{self.name}: {grid[0] * grid[1]} blocks of {threads} threads "
                f"must be resident at once; this GPU holds {held * mc.sm_count(device)}",
                hint="more rows per thread, or train_lastblock")
        run = mc.launch(mod, name, grid, threads, smem, cooperative=True)
        part_floats = sp.pad4(2 * c * grid[0])
        ws = mc.workspace(device, 4 * (part_floats + sp.pad4(c) + 4))
        ws.fill(0)  # the barrier's counter starts at zero and only grows
        part, scale = ws[:part_floats], ws[part_floats:part_floats + c]
        counter = ws[part_floats + sp.pad4(c):][:2].view(np.uint64)
        size = run.consts(np.int64(problem["n"] * problem["h"] * problem["w"]))
        instead: list[Any] = []  # train_lastblock's program, once the driver refused ours

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            if instead:
                instead[0](arrs, eps, momentum)
                return
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv, z = arrs
            try:
                run((x, y, part, counter, *size, rm, rv, nrm, nrv, smean, sinv, w, scale,
                     run.f32(eps), run.f32(momentum), b, z))
            except KernelLaunchError as exc:
                # fewer SMs than the device reports (an MPS share, another process's
                # persistent kernel): the grid cannot be resident at once, and the driver
                # says so before running anything; the two-launch program does the same work
                if "COOPERATIVE" not in str(exc):
                    raise
                instead.append(BnTrainLastBlock().program(problem, dict(SAFE, vec=vec), vec,
                                                          device))
                instead[0](arrs, eps, momentum)

        return go
