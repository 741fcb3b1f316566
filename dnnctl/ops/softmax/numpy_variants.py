"""CPU softmax variants (numpy backend, float32 arithmetic): ``bwd_numpy`` for the backward
pass, ``numpy_whole`` and ``numpy_rows`` (cache-sized blocks of rows) for the forward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Problem
from dnnctl.ops.passes import NumpyBackward, NumpyVariant
from dnnctl.ops.registry import register_variant
from dnnctl.ops.softmax.backward import softmax_backward_numpy
from dnnctl.ops.softmax.op import softmax_numpy


@register_variant
class SoftmaxBwdNumpy(NumpyBackward):
    op = "softmax"
    doc = "fp32 numpy over cache-sized blocks of rows"

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        y, dy, dx = inputs["y"], inputs["dy"], outputs["dx"]
        for r in range(0, problem["rows"], 256):
            mc.put(dx[r:r + 256], softmax_backward_numpy(mc.f32(y[r:r + 256]),
                                                         mc.f32(dy[r:r + 256]), problem["log"]))


class _SoftmaxNumpy(NumpyVariant):
    """Blocks of ``chunk_rows`` rows (all rows at once without the parameter)."""

    op = "softmax"

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        x, y, step = inputs["x"], outputs["y"], params.get("chunk_rows", problem["rows"])
        for r in range(0, problem["rows"], step):
            mc.put(y[r:r + step], softmax_numpy(mc.f32(x[r:r + step]), problem["log"]))


@register_variant
class SoftmaxNumpyWhole(_SoftmaxNumpy):
    name = "numpy_whole"
    doc = "whole-tensor fp32 numpy"


@register_variant
class SoftmaxNumpyRows(_SoftmaxNumpy):
    name = "numpy_rows"
    doc = "fp32 numpy over cache-sized blocks of rows"
    params = {"chunk_rows": (16, 256, 4096)}
