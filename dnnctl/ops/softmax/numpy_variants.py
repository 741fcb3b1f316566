"""CPU softmax variants (numpy backend, float32 arithmetic): ``bwd_numpy`` for the backward
pass, ``numpy_whole`` and ``numpy_rows`` (cache-sized blocks of rows) for the forward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant
from dnnctl.ops.registry import register_variant
from dnnctl.ops.softmax.backward import softmax_backward_numpy
from dnnctl.ops.softmax.op import softmax_numpy


@register_variant
class SoftmaxBwdNumpy(Variant):
    op = "softmax"
    backend = "numpy"
    name = "bwd_numpy"
    passes = ("backward",)
    doc = "fp32 numpy over cache-sized blocks of rows"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log, rows = problem["log"], problem["rows"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            y, dy, dx = inputs["y"], inputs["dy"], outputs["dx"]
            for r in range(0, rows, 256):
                mc.put(dx[r:r + 256], softmax_backward_numpy(mc.f32(y[r:r + 256]),
                                                             mc.f32(dy[r:r + 256]), log))

        return kernel


@register_variant
class SoftmaxNumpyWhole(Variant):
    op = "softmax"
    backend = "numpy"
    name = "numpy_whole"
    doc = "whole-tensor fp32 numpy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log = problem["log"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            mc.put(outputs["y"], softmax_numpy(mc.f32(inputs["x"]), log))

        return kernel


@register_variant
class SoftmaxNumpyRows(Variant):
    op = "softmax"
    backend = "numpy"
    name = "numpy_rows"
    doc = "fp32 numpy over cache-sized blocks of rows"
    params = {"chunk_rows": (16, 256, 4096)}

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log, step, rows = problem["log"], params["chunk_rows"], problem["rows"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            for r in range(0, rows, step):
                mc.put(y[r:r + step], softmax_numpy(mc.f32(x[r:r + step]), log))

        return kernel
