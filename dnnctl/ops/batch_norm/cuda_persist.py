"""batch_norm training in one cooperative launch: ``train_persist`` (forward) and
``bwd_persist`` (backward), NHWC.

Every block stages its rows of x in shared memory (cp.async), sums them, and waits at a
grid-wide barrier; the grid's warps fold the per-block partials (a warp per channel, fixed
order) and write the statistics; after a second barrier each block normalizes the x it
still holds (kernels/norm/bn_persist.cu). x is read from memory once instead of twice, and
one launch replaces two: what the small and mid-sized layers of a ResNet lose to launch,
tail and fold latency. The backward does the same with dy and x
(kernels/norm/bn_bwd_persist.cu), against cuDNN's semi-persistent backward.

All blocks must be resident at once, so the launch is cooperative
(cuLaunchCooperativeKernel) and the grid is sized from the driver's occupancy calculator:
a layer fits when its x fits in the shared memory of the blocks the GPU holds (about 30 MB on
an H100 / H200 at one 512-thread block per SM). Larger layers, NCHW and a misaligned call's
scalar program run ``train_lastblock``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import KernelLaunchError, UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.batch_norm.backward import epilogue_defines
from dnnctl.ops.batch_norm.cuda_backward import BnBwdKernel, BnBwdReduceDx
from dnnctl.ops.batch_norm.cuda_onepass import BnTrainLastBlock
from dnnctl.ops.batch_norm.cuda_variants import _BnCuda, _BnKernel
from dnnctl.ops.batch_norm.persist_fit import (
    BLOCKS,
    ROWS,
    SAFE,
    bwd_fits,
    bwd_smem_bytes,
    fits,
    geometry,
    resident_estimate,
    smem_bytes,
    splits,
)
from dnnctl.ops.registry import register_variant


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
    params = {"block": BLOCKS, "vec": mc.VECS, "rows": ROWS}

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


# ----------------------------------------------------------------------------- backward


@register_variant
class BnBwdPersist(mc.CudaBackward):
    op = "batch_norm"
    name = "bwd_persist"
    source = "norm/bn_bwd_persist.cu"
    doc = ("one cooperative launch, dy and x read once: blocks stage them in shared memory, "
           "sum, grid barrier, a warp per channel folds, grid barrier, dx from shared memory "
           "(NHWC layers whose dy and x fit on chip)")
    params = {"block": BLOCKS, "vec": mc.VECS, "rows": ROWS}

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["layout"] != "NHWC":
            return unsupported("NHWC only (NCHW: bwd_reduce_dx)")
        if not any(bwd_fits(problem, {"block": b, "rows": r}, v, device)
                   for b in self.params["block"] for r in self.params["rows"]
                   for v in mc.VECS if sp.vec_ok(problem, v)):
            return unsupported("dy and x do not fit in the shared memory of the blocks the "
                               "GPU holds at once (bwd_reduce_dx reads them twice)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"]) and bwd_fits(problem, params, params["vec"],
                                                              device)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        geo = geometry(problem["c"], params["vec"], params["block"])
        if geo is None:
            return 0
        s = splits(problem, geo[2], params["rows"])
        return 4 * (sp.pad4(2 * problem["c"] * s) + sp.pad4(5 * problem["c"]) + 4)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        if not self.valid_params(problem, params, device):
            raise UnsupportedError(f"batch_norm/{self.name}: {dict(params)} does not fit "
                                   "this layer on this GPU")
        vec = params["vec"]
        c = problem["c"]
        threads, lanes, rb = geometry(c, vec, params["block"])  # type: ignore[misc]
        rows = params["rows"]
        name = f"bn_bwd_persist_rows<{threads},{vec},{rows}>"
        mod = mc.compile_cuda(self.source, {
            "DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "AFFINE": int(problem["affine"]),
            "LAYOUT": 1, "CH": c, **epilogue_defines(problem)}, [name], device)
        smem = bwd_smem_bytes(problem, threads, rb, vec, rows)
        grid = (splits(problem, rb, rows), c // vec // lanes)
        held = mc.cuda.max_active_blocks(mod, name, threads, smem)
        if held is None:
            held = resident_estimate(threads, smem, vec, rows)
        if grid[0] * grid[1] > held * mc.sm_count(device):
            raise UnsupportedError(
                f"batch_norm/{self.name}: {grid[0] * grid[1]} blocks of {threads} threads "
                f"must be resident at once; this GPU holds {held * mc.sm_count(device)}",
                hint="more rows per thread, or bwd_reduce_dx")
        run = mc.launch(mod, name, grid, threads, smem, cooperative=True)
        part_floats, coef_floats = sp.pad4(2 * c * grid[0]), sp.pad4(5 * c)
        ws = mc.workspace(device, 4 * (part_floats + coef_floats + 4))
        ws.fill(0)  # the barrier's counter starts at zero and only grows
        part, coef = ws[:part_floats], ws[part_floats:part_floats + 5 * c]
        counter = ws[part_floats + coef_floats:][:2].view(np.uint64)
        size = run.consts(np.int64(problem["n"] * problem["h"] * problem["w"]))
        two_pass = BnBwdReduceDx()
        base = {"block": 256, "waves": 4, "tile": 128, "unroll": 1, "rev": 0}
        instead: list[Any] = []  # bwd_reduce_dx's program, once the driver refused ours

        def fast(dy: Any, x: Any, w: Any, mean: Any, invstd: Any, dxa: Any, dw: Any,
                 db: Any, bias: Any, z: Any, dz: Any) -> None:
            if instead:
                instead[0](dy, x, w, mean, invstd, dxa, dw, db, bias, z, dz)
                return
            try:
                run((dy, x, mean, part, counter, *size, invstd, w, dw, db, coef, bias, z, dxa,
                     dz))
            except KernelLaunchError as exc:  # fewer SMs than reported (see train_persist)
                if "COOPERATIVE" not in str(exc):
                    raise
                instead.append(two_pass.build(problem, dict(base, vec=vec), device).fast)
                instead[0](dy, x, w, mean, invstd, dxa, dw, db, bias, z, dz)

        safe = two_pass.build(problem, dict(base, vec=1), device).safe
        return BnBwdKernel(fast, safe, vec * dtype_size(problem["dtype"]),
                           ("save_mean", "save_invstd"))
