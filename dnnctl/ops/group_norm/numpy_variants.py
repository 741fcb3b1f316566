"""CPU group_norm variants (numpy backend): ``bwd_numpy`` (backward), ``numpy_whole`` and
``numpy_samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant
from dnnctl.ops.group_norm.backward import gn_backward_numpy
from dnnctl.ops.group_norm.op import gn_numpy
from dnnctl.ops.passes import NumpyBackward, f32_or_none
from dnnctl.ops.registry import register_variant


@register_variant
class GnBwdNumpy(NumpyBackward):
    op = "group_norm"
    doc = "fp32 numpy (float64 parameter sums)"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return gn_backward_numpy(problem, mc.f32(inputs["dy"]), mc.f32(inputs["x"]),
                                 f32_or_none(inputs.get("weight")), mc.f32(inputs["mean"]),
                                 mc.f32(inputs["rstd"]))


class _GnNumpy(Variant):
    op = "group_norm"
    backend = "numpy"
    per_sample = False

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        one = Problem(problem.op, tuple((k, 1 if k == "n" else v) for k, v in problem.key))
        per_sample = self.per_sample

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            w = None if "weight" not in inputs else mc.f32(inputs["weight"])
            b = None if "bias" not in inputs else mc.f32(inputs["bias"])
            eps = float(attrs.get("eps", 1e-5))
            if not per_sample:
                mc.put(y, gn_numpy(problem, mc.f32(x), w, b, eps))
                return
            for i in range(problem["n"]):
                mc.put(y[i:i + 1], gn_numpy(one, mc.f32(x[i:i + 1]), w, b, eps))

        return kernel


@register_variant
class GnNumpyWhole(_GnNumpy):
    name = "numpy_whole"
    doc = "whole-batch fp32 numpy"


@register_variant
class GnNumpySamples(_GnNumpy):
    name = "numpy_samples"
    doc = "fp32 numpy one sample at a time (cache-sized working set)"
    per_sample = True
