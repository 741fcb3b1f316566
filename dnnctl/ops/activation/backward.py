"""Activation backward: op ``activation`` with ``pass: backward``.

Inputs: ``dy``, the forward's input ``x`` and, with ``bias: channel``, the ``bias``; outputs
``dx = dy * act'(x + bias)`` and, with a bias, its gradient ``dbias`` (the sum of dx per
channel) fused into the same pass. CUDA variants (kernels/activation/backward.cu):
``bwd_stream`` (no bias: a grid-stride vector stream) and ``bwd_channel`` (channel bias:
channel-stationary blocks write dx and partial bias sums, a finishing sum per channel).
CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.reference import act_backward_numpy
from dnnctl.ops.base import Choice, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import GRAD_TOL, BackwardSpec

geometry = mc.channel_geometry  # (elements, inner, channels), as the forward's


class ActivationBackward(BackwardSpec):
    def check(self, op: Op, key: dict[str, Any]) -> None:
        if key["inplace"]:
            raise UsageError("activation: the backward pass has no in-place form",
                             hint="set inplace: false in the key")

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        t = TensorSpec(problem["shape"], problem["dtype"])
        specs = {"dy": t, "x": t}
        if problem["bias"] == "channel":
            specs["bias"] = TensorSpec((geometry(problem)[2],), problem["dtype"])
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"dx": TensorSpec(problem["shape"], problem["dtype"])}
        if problem["bias"] == "channel":
            specs["dbias"] = TensorSpec((geometry(problem)[2],), problem["dtype"])
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt, shape = np_dtype(problem["dtype"]), problem["shape"]
        out = {"dy": rng.standard_normal(shape).astype(dt),
               "x": (rng.standard_normal(shape) * 2).astype(dt)}
        if problem["bias"] == "channel":
            out["bias"] = (rng.standard_normal(geometry(problem)[2]) * 0.5).astype(dt)
        return out

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return act_backward_numpy(problem, inputs["dy"], inputs["x"], inputs.get("bias"),
                                  float(attrs.get("negative_slope", 0.01)))

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]] * (1 if output == "dx" else 2)

    def flops(self, op: Op, problem: Problem) -> float:
        return 12.0 * math.prod(problem["shape"])

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        name = "bwd_channel" if problem["bias"] == "channel" else "bwd_stream"
        vec = max(v for v in mc.VECS if vec_ok(problem, v))
        return Choice.of(name, {"block": 256, "vec": vec, "waves": 4})


ACTIVATION_BACKWARD = ActivationBackward()


def vec_ok(problem: Problem, vec: int) -> bool:
    if not mc.vec_fits(problem["dtype"], vec):
        return False
    n, inner, c = geometry(problem)
    if problem["bias"] == "none":
        return n % vec == 0
    return (inner if problem["layout"] == "NCHW" else c) % vec == 0
