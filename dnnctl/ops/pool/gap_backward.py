"""global_avg_pool2d backward: op ``global_avg_pool2d`` with ``pass: backward``: ``dy``
(N, C, 1, 1) / (N, 1, 1, C) -> ``dx`` = dy / (H W) everywhere. Variants ``bwd_broadcast``
(CUDA, kernels/pool/gap_backward.cu) and ``bwd_numpy``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import tensor_shape
from dnnctl.ops.base import Choice, Kernel, Op, Problem, TensorSpec, dtype_size
from dnnctl.ops.passes import BackwardSpec, NumpyBackward
from dnnctl.ops.registry import register_variant


def gap_shape(problem: Problem) -> tuple[int, int, int, int]:
    """The forward's output (and so the backward's dy): (N, C, 1, 1) or (N, 1, 1, C)."""
    n, c = problem["n"], problem["c"]
    return (n, c, 1, 1) if problem["layout"] == "NCHW" else (n, 1, 1, c)


class GapBackward(BackwardSpec):
    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        return {"dy": TensorSpec(gap_shape(problem), problem["dtype"])}

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        return {"dx": TensorSpec(tensor_shape(problem), problem["dtype"])}

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        hw = problem["h"] * problem["w"]
        return {"dx": np.broadcast_to(inputs["dy"] / hw, tensor_shape(problem))}

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        vec = max(v for v in mc.VECS if _gap_vec_ok(problem, v))
        return Choice.of("bwd_broadcast", {"block": 256, "vec": vec})


GAP_BACKWARD = GapBackward()


def _gap_vec_ok(problem: Problem, vec: int) -> bool:
    inner = problem["h"] * problem["w"] if problem["layout"] == "NCHW" else problem["c"]
    return mc.vec_fits(problem["dtype"], vec) and inner % vec == 0


@register_variant
class GapBwdBroadcast(mc.CudaBackward):
    op = "global_avg_pool2d"
    name = "bwd_broadcast"
    source = "pool/gap_backward.cu"
    params = {"block": (128, 256, 512), "vec": mc.VECS}
    doc = "a grid-stride vector stream writing dy / (H W) over every position"

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return _gap_vec_ok(problem, params["vec"])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if _gap_vec_ok(problem, params["vec"]) else 1
        numel = math.prod(tensor_shape(problem))
        itype, block = mc.index_type(numel), params["block"]
        names = [f"gap_bwd<{block},{v},{itype}>" for v in dict.fromkeys((vec, 1))]
        mod = mc.compile_cuda(self.source, {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                                            "LAYOUT": int(problem["layout"] == "NHWC")},
                              names, device)
        hw = problem["h"] * problem["w"]

        def program(v: int) -> Any:
            nvec = numel // v
            run = mc.stream_launch(mod, f"gap_bwd<{block},{v},{itype}>", nvec, block, device)
            dims = run.consts(mc.index_scalar(nvec, itype), np.int32(problem["c"]),
                              np.int32(hw), np.float32(1.0 / hw))
            return lambda dy, dx: run((dy, dx, *dims))

        return mc.PairKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                             "dy", "dx")


register_variant(NumpyBackward.of("global_avg_pool2d", GAP_BACKWARD,
                                  "numpy broadcast"))
