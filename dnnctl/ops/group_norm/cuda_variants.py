"""CUDA group_norm variants (kernels/norm/gn_block.cu, gn_split.cu): ``block_group`` and
``split_group``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.group_norm.op import gn_vec_ok
from dnnctl.ops.registry import register_variant


class _GnKernel(mc.VecKernel):
    __slots__ = ()

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        go = self.fast if mc.aligned(self.align, x, y) else self.safe
        go(x, y, inputs.get("weight"), inputs.get("bias"), np.float32(attrs.get("eps", 1e-5)))


class _GnCuda(mc.CudaVariant):
    op = "group_norm"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                "LAYOUT": int(problem["layout"] == "NHWC"), "AFFINE": int(problem["affine"])}

    def dims(self, problem: Problem) -> tuple:
        return (np.int32(problem["c"]), np.int32(problem["h"] * problem["w"]),
                np.int32(problem["groups"]))

    def group_size(self, problem: Problem) -> int:
        return problem["c"] // problem["groups"] * problem["h"] * problem["w"]

    def wrap(self, problem: Problem, vec: int, fast: Any, safe: Any) -> Kernel:
        return _GnKernel(fast, safe, vec * dtype_size(problem["dtype"]))


@register_variant
class GnBlockGroup(_GnCuda):
    name = "block_group"
    source = "norm/gn_block.cu"
    doc = "a block per (n, group): Welford pass, then normalize (stage=1: from shared memory)"
    params = {"block": (128, 256, 512, 1024), "vec": mc.VECS, "stage": (0, 1)}

    def staged_bytes(self, problem: Problem) -> int:
        return -(-self.group_size(problem) * dtype_size(problem["dtype"]) // 16) * 16

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if params["stage"] and self.staged_bytes(problem) + 1024 > mc.smem_limit(device):
            return False
        busy = params["block"] == 128 or params["block"] // 2 * params["vec"] < \
            self.group_size(problem)
        return gn_vec_ok(problem, params["vec"]) and busy

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, stage = params["block"], params["stage"]
        if stage and self.staged_bytes(problem) + 1024 > mc.smem_limit(device):
            stage = 0
        mod = self.compile(problem, params, device, lambda v: f"gn_block<{block},{v},{stage}>")
        run = mc.launch(mod, f"gn_block<{block},{vec},{stage}>",
                        problem["n"] * problem["groups"], block,
                        self.staged_bytes(problem) if stage else 0)
        dims = run.consts(*self.dims(problem))

        def go(x: Any, y: Any, w: Any, b: Any, eps: Any) -> None:
            run((x, y, w, b, *dims, run.f32(eps)))

        return go


@register_variant
class GnSplitGroup(_GnCuda):
    name = "split_group"
    source = "norm/gn_split.cu"
    doc = "few groups: slices of each group on separate blocks, partial Welford then apply"
    params = {"block": (256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["n"] * problem["groups"] > 65535:
            return unsupported("more than 65535 groups in the batch (grid y): use block_group")
        if self.group_size(problem) < 4096:
            return unsupported("groups smaller than 4096 elements gain nothing from splitting")
        if next(self.param_space(problem, device), None) is None:
            return unsupported("enough groups to fill the GPU one block each: use block_group")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return (gn_vec_ok(problem, params["vec"])
                and self.slices(problem, params, mc.sm_count(device)) >= 2)

    def slices(self, problem: Problem, params: Mapping[str, Any], sms: int) -> int:
        groups = problem["n"] * problem["groups"]
        most = self.group_size(problem) // (params["block"] * params["vec"] * 2)
        return max(1, min(mc.cdiv(sms * params["waves"], groups), most, 4096))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 12 * problem["n"] * problem["groups"] * self.slices(problem, params, 132)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block = params["block"]
        slices = self.slices(problem, params, mc.sm_count(device))
        groups = problem["n"] * problem["groups"]
        mod = self.compile(problem, params, device, lambda v: f"gn_split_stats<{block},{v}>",
                           lambda v: f"gn_split_apply<{block},{v}>")
        stats = mc.launch(mod, f"gn_split_stats<{block},{vec}>", (slices, groups), block)
        apply = mc.launch(mod, f"gn_split_apply<{block},{vec}>", (slices, groups), block)
        part = mc.workspace(device, 12 * groups * slices)
        dims = stats.consts(*self.dims(problem))

        def go(x: Any, y: Any, w: Any, b: Any, eps: Any) -> None:
            stats((x, part, *dims))
            apply((x, part, y, w, b, *dims, apply.f32(eps)))

        return go


