"""batch_norm training in one cooperative launch: ``train_persist`` (forward) and
``bwd_persist`` (backward), NHWC.

Every block stages its rows of x (backward: dy and x, and a fused residual) in shared memory
(cp.async), sums them, and waits at a grid-wide barrier; the grid's warps fold the per-block
partials (a warp per channel, fixed order) and write the statistics (backward: dweight,
dbias and the dx coefficients); after a second barrier each block writes y (dx) from what it
still holds (kernels/norm/bn_persist.cu, bn_bwd_persist.cu, <dnnctl/persist_rows.cuh>). The
tensors are read from memory once instead of twice, and one launch replaces two: what the
small and mid-sized layers of a ResNet lose to launch, tail and fold latency, and what
cuDNN's semi-persistent backward does.

All blocks must be resident at once, so the launch is cooperative
(cuLaunchCooperativeKernel) and the grid is sized from the driver's occupancy calculator:
a layer fits when its staged tensors fit in the shared memory of the blocks the GPU holds
(about 30 MB on an H100 / H200; :mod:`~dnnctl.ops.batch_norm.persist_fit`). Larger layers,
NCHW, a misaligned call's scalar program, and a launch the driver refuses (an MPS share with
fewer SMs than reported) run the two-launch variants.

Both are tuner candidates, not the op's defaults (see the op's and the backward's default
choice for the H100 measurements that decided it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    default_params,
    fits,
    resident_estimate,
    shape,
    workspace_floats,
)
from dnnctl.ops.registry import register_variant


class _Persist:
    """What both persistent variants share: the fit, the workspace, the cooperative launch
    and the fallback when the driver refuses it."""

    name: str
    source: str
    kernel: str  # the kernel template's name in ``source``
    two_pass: str  # the variant that takes what this one cannot
    # rows: vectors of each staged tensor a thread holds (its share in shared memory)
    params = {"block": BLOCKS, "vec": mc.VECS, "rows": ROWS}

    def fit_support(self, problem: Problem, device: Any) -> Support:
        if problem["layout"] != "NHWC":
            return unsupported(f"NHWC only (NCHW: {self.two_pass})")
        if not any(fits(problem, {"block": b, "rows": r}, v, device)
                   for b in BLOCKS for r in ROWS for v in mc.VECS if sp.vec_ok(problem, v)):
            return unsupported("the layer does not fit in the shared memory of the blocks "
                               f"the GPU holds at once ({self.two_pass} reads it twice)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"]) and fits(problem, params, params["vec"],
                                                          device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        """The parameters to run this variant at without tuning (one block per SM where the
        layer allows it), None where it does not fit."""
        return default_params(problem, device)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        sh = shape(problem, params["block"], params["vec"], params["rows"])
        if sh is None:
            return 0
        return 4 * workspace_floats(problem, sh, self.out_floats(problem))[1]

    def out_floats(self, problem: Problem) -> int:
        """Floats of per-channel results the fold writes for the last phase."""
        raise NotImplementedError

    def cooperative(self, problem: Problem, params: Mapping[str, Any], vec: int,
                    defines: dict[str, Any], device: Any) -> tuple[mc.Launch, Any, Any, Any]:
        """(the launch, the split partials, the fold's per-channel results, the barrier's
        counter); raises UnsupportedError where the driver holds fewer blocks at once than
        the grid has."""
        rows = params["rows"]
        sh = shape(problem, params["block"], vec, rows)
        if sh is None:
            raise UnsupportedError(f"batch_norm/{self.name}: no block shape for "
                                   f"{problem['c']} channels in {vec}-wide vectors")
        kernel = f"{self.kernel}<{sh.threads},{vec},{rows}>"
        mod = mc.compile_cuda(self.source, {**defines, "CH": problem["c"]}, [kernel], device)
        held = mc.cuda.max_active_blocks(mod, kernel, sh.threads, sh.smem)
        if held is None:
            held = resident_estimate(problem, sh, vec, rows)
        if sh.blocks > held * mc.sm_count(device):
            raise UnsupportedError(
                f"batch_norm/{self.name}: {sh.blocks} blocks of {sh.threads} threads must be "
                f"resident at once; this GPU holds {held * mc.sm_count(device)}",
                hint=f"more rows per thread, or {self.two_pass}")
        run = mc.launch(mod, kernel, sh.grid, sh.threads, sh.smem, cooperative=True)
        out_floats = self.out_floats(problem)
        part_floats, total = workspace_floats(problem, sh, out_floats)
        ws = mc.workspace(device, 4 * total)
        ws.fill(0)  # the barrier's counter starts at zero and only grows
        counter = ws[part_floats + out_floats:][:2].view(np.uint64)
        return run, ws[:part_floats], ws[part_floats:part_floats + out_floats], counter


def _or_instead(launch: Callable[..., None], make: Callable[[], Callable[..., None]]
                ) -> Callable[..., None]:
    """``launch``, or from the first call the driver refuses as a cooperative launch on (fewer
    SMs than reported: an MPS share, another process's persistent kernel), the program
    ``make()`` builds; it refuses before running anything, so nothing is done twice."""
    instead: list[Callable[..., None]] = []

    def go(*args: Any) -> None:
        if instead:
            instead[0](*args)
            return
        try:
            launch(*args)
        except KernelLaunchError as exc:
            if "COOPERATIVE" not in str(exc):
                raise
            instead.append(make())
            instead[0](*args)

    return go


@register_variant
class BnTrainPersist(_Persist, _BnCuda):
    name = "train_persist"
    fused_epilogue = True
    source = "norm/bn_persist.cu"
    kernel = "bn_persist_rows"
    training = True
    two_pass = "train_lastblock"
    doc = ("one cooperative launch, x read once: blocks stage x in shared memory, sum, "
           "grid barrier, a warp per channel folds, grid barrier, normalize from shared "
           "memory (NHWC layers that fit on chip)")

    def supports(self, problem: Problem, device: Any) -> Support:
        base = _BnCuda.supports(self, problem, device)
        return self.fit_support(problem, device) if base else base

    def out_floats(self, problem: Problem) -> int:
        return sp.pad4(problem["c"])  # scale = weight * invstd

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        if not self.valid_params(problem, params, device):
            raise UnsupportedError(f"batch_norm/{self.name}: {dict(params)} does not fit "
                                   "this layer on this GPU")
        vec = params["vec"]
        fast = self.program(problem, params, vec, device)
        safe = BnTrainLastBlock().program(problem, SAFE, 1, device)
        return _BnKernel(fast, safe, vec * dtype_size(problem["dtype"]), True)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        run, part, scale, counter = self.cooperative(problem, params, vec,
                                                     self.defines(problem, 1), device)
        size = run.consts(np.int64(problem["n"] * problem["h"] * problem["w"]))

        def launch(arrs: tuple, eps: Any, momentum: Any) -> None:
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv, z = arrs
            run((x, y, part, counter, *size, rm, rv, nrm, nrv, smean, sinv, w, scale,
                 run.f32(eps), run.f32(momentum), b, z))

        return _or_instead(launch, lambda: BnTrainLastBlock().program(
            problem, dict(SAFE, vec=vec), vec, device))


@register_variant
class BnBwdPersist(_Persist, mc.CudaBackward):
    op = "batch_norm"
    name = "bwd_persist"
    source = "norm/bn_bwd_persist.cu"
    kernel = "bn_bwd_persist_rows"
    two_pass = "bwd_reduce_dx"
    doc = ("one cooperative launch, dy and x read once: blocks stage them in shared memory, "
           "sum, grid barrier, a warp per channel folds, grid barrier, dx from shared memory "
           "(NHWC layers whose dy and x fit on chip)")
    TWO_PASS = {"block": 256, "waves": 4, "tile": 128, "unroll": 1, "rev": 0}

    def supports(self, problem: Problem, device: Any) -> Support:
        return self.fit_support(problem, device)

    def out_floats(self, problem: Problem) -> int:
        return sp.pad4(5 * problem["c"])  # the dx coefficients (bn_bwd_finish)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        if not self.valid_params(problem, params, device):
            raise UnsupportedError(f"batch_norm/{self.name}: {dict(params)} does not fit "
                                   "this layer on this GPU")
        vec = params["vec"]
        defines = {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                   "AFFINE": int(problem["affine"]), "LAYOUT": 1, **epilogue_defines(problem)}
        run, part, coef, counter = self.cooperative(problem, params, vec, defines, device)
        size = run.consts(np.int64(problem["n"] * problem["h"] * problem["w"]))
        two_pass = BnBwdReduceDx()

        def launch(dy: Any, x: Any, w: Any, mean: Any, invstd: Any, dxa: Any, dw: Any,
                   db: Any, bias: Any, z: Any, dz: Any) -> None:
            run((dy, x, mean, part, counter, *size, invstd, w, dw, db, coef, bias, z, dxa, dz))

        fast = _or_instead(launch, lambda: two_pass.build(
            problem, dict(self.TWO_PASS, vec=vec), device).fast)
        safe = two_pass.build(problem, dict(self.TWO_PASS, vec=1), device).safe
        return BnBwdKernel(fast, safe, vec * dtype_size(problem["dtype"]),
                           ("save_mean", "save_invstd"))
