"""CPU group_norm variants (numpy backend): ``bwd_numpy`` (backward), ``numpy_whole`` and
``numpy_samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Problem
from dnnctl.ops.group_norm.backward import GROUP_NORM_BACKWARD
from dnnctl.ops.group_norm.op import gn_numpy
from dnnctl.ops.passes import NumpyBackward, NumpyVariant, f32_or_none
from dnnctl.ops.registry import register_variant

register_variant(NumpyBackward.of("group_norm", GROUP_NORM_BACKWARD,
                                  "fp32 numpy (float64 parameter sums)"))


class _GnNumpy(NumpyVariant):
    op = "group_norm"
    per_sample = False

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        w, b = f32_or_none(inputs.get("weight")), f32_or_none(inputs.get("bias"))
        eps = float(attrs.get("eps", 1e-5))
        if not self.per_sample:
            mc.put(y, gn_numpy(problem, mc.f32(x), w, b, eps))
            return
        one = Problem(problem.op, tuple((k, 1 if k == "n" else v) for k, v in problem.key))
        for i in range(problem["n"]):
            mc.put(y[i:i + 1], gn_numpy(one, mc.f32(x[i:i + 1]), w, b, eps))


@register_variant
class GnNumpyWhole(_GnNumpy):
    name = "numpy_whole"
    doc = "whole-batch fp32 numpy"


@register_variant
class GnNumpySamples(_GnNumpy):
    name = "numpy_samples"
    doc = "fp32 numpy one sample at a time (cache-sized working set)"
    per_sample = True
