"""CUDA batch_norm variants (kernels/norm/bn_flat.cu, bn_channel.cu, bn_train.cu):
``infer_flat``, ``infer_channel``, ``train_fused`` and ``train_two_pass``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.batch_norm.backward import epilogue_defines
from dnnctl.ops.registry import register_variant


class _BnKernel(mc.VecKernel):
    """Runs ``fast`` when x and y are aligned to the vector width, else ``safe``."""

    __slots__ = ("training", "scalars")

    def __init__(self, fast: Callable, safe: Callable, align: int, training: bool) -> None:
        super().__init__(fast, safe, align)
        self.training = training
        # (eps, momentum) as last given and as float32 (converted once per value)
        self.scalars: tuple = (None, None, None, None)

    def vector_ok(self, arrs: tuple) -> bool:
        """The arrays allow the vector program (x, y and a residual aligned to its width)."""
        return mc.aligned(self.align, arrs[0], arrs[1], arrs[-1])

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        get = inputs.get
        # last: the fused variants' z (else None)
        if self.training:
            arrs = (inputs["x"], outputs["y"], inputs["running_mean"], inputs["running_var"],
                    get("weight"), get("bias"), outputs["new_running_mean"],
                    outputs["new_running_var"], outputs["save_mean"], outputs["save_invstd"],
                    get("residual"))
        else:
            arrs = (inputs["x"], outputs["y"], inputs["running_mean"], inputs["running_var"],
                    get("weight"), get("bias"), get("residual"))
        eps, momentum = attrs.get("eps", 1e-5), attrs.get("momentum", 0.1)
        sc = self.scalars
        if sc[0] != eps or sc[1] != momentum:
            sc = self.scalars = (eps, momentum, np.float32(eps), np.float32(momentum))
        go = self.fast if self.vector_ok(arrs) else self.safe
        go(arrs, sc[2], sc[3])


class _BnCuda(mc.CudaVariant):
    op = "batch_norm"
    training = False
    # takes activation: relu and residual (the exact-grid normalize of bn_exact.cuh)
    fused_epilogue = False

    def defines(self, problem: Problem, params: int = 0) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                "AFFINE": int(problem["affine"]), "PARAMS": params,
                "LAYOUT": int(problem["layout"] == "NHWC"), **epilogue_defines(problem)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["training"] != self.training:
            return unsupported("training-mode variant" if self.training
                               else "inference variant (training=false only)")
        if ((problem.get("activation", "none") != "none" or problem.get("residual"))
                and not self.fused_epilogue):
            return unsupported("no fused activation or residual: infer_exact, train_stream "
                               "and train_lastblock take them")
        return SUPPORTED

    def vecs(self, problem: Problem, params: Mapping[str, Any], device: Any) -> tuple[int, ...]:
        """The vector widths a build compiles: the planned one (if valid) and 1."""
        vec = params["vec"] if self.valid_params(problem, params, device) else 1
        return tuple(dict.fromkeys((vec, 1)))

    def wrap(self, problem: Problem, vec: int, fast: Any, safe: Any) -> Kernel:
        return _BnKernel(fast, safe, vec * dtype_size(problem["dtype"]), self.training)


@register_variant
class BnInferFlat(_BnCuda):
    name = "infer_flat"
    source = "norm/bn_flat.cu"
    doc = "grid-stride vector stream; channel parameters folded per block into shared memory"
    params = {"block": (256, 512), "vec": mc.VECS, "unroll": (1, 2, 4),
              "blocks_per_sm": (2, 4, 8)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if 12 * problem["c"] + 1024 > mc.smem_limit(device):
            return unsupported("too many channels for the shared-memory parameter table")
        return _BnCuda.supports(self, problem, device)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        n = sp.numel(problem)
        itype = mc.index_type(n)
        block, unroll = params["block"], params["unroll"]
        names = [f"bn_flat<{block},{v},{unroll},{itype}>"
                 for v in self.vecs(problem, params, device)]
        mod = mc.compile_cuda(self.source, self.defines(problem, 0), names, device)
        grid = max(1, min(mc.cdiv(n // vec, block * unroll),
                          mc.sm_count(device) * params["blocks_per_sm"]))
        run = mc.launch(mod, f"bn_flat<{block},{vec},{unroll},{itype}>", grid, block,
                        12 * problem["c"])
        sizes = run.consts(*(mc.index_scalar(v, itype) for v in (
            n, problem["h"] * problem["w"], problem["c"])))

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            run((*arrs[:6], *sizes, run.f32(eps)))

        return go


@register_variant
class BnInferChannel(_BnCuda):
    name = "infer_channel"
    source = "norm/bn_channel.cu"
    doc = "channel-stationary: NCHW a block per plane, NHWC threads pinned to channel vectors"
    params = {"block": (128, 256, 512), "vec": mc.VECS, "unroll": (1, 2, 4)}

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        mod = mc.compile_cuda(self.source, self.defines(problem, 0), sp.normalize_names(
            problem, params["block"], self.vecs(problem, params, device), params["unroll"]),
            device)
        run, tail = sp.normalize_launch(mod, problem, params["block"], vec, params["unroll"],
                                        device)

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            run((*arrs[:6], *tail, run.f32(eps)))

        return go


class _BnTrain(_BnCuda):
    source = "norm/bn_train.cu"
    training = True
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}
    modes: tuple[int, ...] = (0,)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        splits = sp.stats_splits(problem, params["block"], params["vec"], params["waves"], 132)
        return 4 * problem["c"] * (3 * splits + 2)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        block, waves, c = params["block"], params["waves"], problem["c"]
        vecs = self.vecs(problem, params, device)
        kind = "planes" if problem["layout"] == "NCHW" else "rows"
        names = [f"bn_stats_{kind}<{block},{v},{m}>" for v in vecs for m in self.modes]
        names += [f"bn_finalize<{s}>" for s in self.modes]
        names += sp.normalize_names(problem, block, vecs, 2)
        mod = mc.compile_cuda(self.source, self.defines(problem, 1), names, device)
        stats, splits = sp.stats_launches(mod, problem, block, vec, waves, self.modes, device)
        ws = mc.workspace(device, 4 * c * (3 * splits + 2))
        part, ws_mean, ws_scale = ws[:3 * c * splits], ws[3 * c * splits:][:c], ws[-c:]
        fin = {s: mc.launch(mod, f"bn_finalize<{s}>", mc.cdiv(c, 128), 128) for s in self.modes}
        norm, tail = sp.normalize_launch(mod, problem, block, vec, 2, device)
        dims = norm.consts(np.int32(splits), np.int32(c))
        modes = self.modes

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv = arrs[:10]
            eps32 = norm.f32(eps)
            fin_args = (part, *dims, rm, rv, nrm, nrv, smean, sinv, w, ws_mean, ws_scale,
                        eps32, norm.f32(momentum))
            for mode in modes:  # (0,): fused; (1, 2): mean pass then centered pass
                stats[mode]((x, part, ws_mean))
                fin[mode](fin_args)
            norm((x, y, smean, ws_scale, w, b, *tail, eps32))

        return go


@register_variant
class BnTrainFused(_BnTrain):
    name = "train_fused"
    doc = "one reduction pass (shifted sums -> Welford, Chan combine), then normalize"
    modes = (0,)


@register_variant
class BnTrainTwoPass(_BnTrain):
    name = "train_two_pass"
    doc = "a mean pass, a centered sum-of-squares pass, then normalize (3 reads)"
    modes = (1, 2)


