"""CPU batch_norm variants (numpy backend): ``bwd_numpy`` (backward), ``numpy_two_pass``
and ``numpy_one_pass``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Problem, Support, unsupported
from dnnctl.ops.batch_norm.backward import BATCH_NORM_BACKWARD
from dnnctl.ops.batch_norm.op import bn_numpy
from dnnctl.ops.passes import NumpyBackward, NumpyVariant
from dnnctl.ops.registry import register_variant

register_variant(NumpyBackward.of("batch_norm", BATCH_NORM_BACKWARD,
                                  "fp32 numpy, float64 channel sums"))


class _BnNumpy(NumpyVariant):
    op = "batch_norm"
    one_pass = False

    def supports(self, problem: Problem, device: Any) -> Support:
        if self.one_pass and not problem["training"]:
            return unsupported("one-pass statistics only matter in training")
        return SUPPORTED

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return bn_numpy(problem, mc.f32(inputs["x"]), inputs, float(attrs.get("eps", 1e-5)),
                        float(attrs.get("momentum", 0.1)), self.one_pass)


@register_variant
class BnNumpyTwoPass(_BnNumpy):
    name = "numpy_two_pass"
    doc = "float64 mean, then centered variance; fp32 normalize"


@register_variant
class BnNumpyOnePass(_BnNumpy):
    name = "numpy_one_pass"
    doc = "training: float64 sum and sum of squares in one pass; fp32 normalize"
    one_pass = True
