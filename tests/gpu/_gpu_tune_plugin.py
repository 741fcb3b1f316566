"""Test-only plugin for the GPU tuner test: op ``toy_gpu_scale`` (y = 2x, float32) with CuPy
variants that are good, wrong, or write to address 0 (a sticky CUDA illegal-address error
that poisons the worker's context). Loaded only into tuning subprocesses (--plugin)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
    Field,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    Variant,
)
from dnnctl.ops.registry import register_op, register_variant

_SRC = r'''
extern "C" __global__ void scale2(const float* x, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.f * x[i];
}
extern "C" __global__ void poke_null(float* never_used) {
  float* volatile p = nullptr;
  p[threadIdx.x * 1024] = 1.f;
}
'''


@register_op
class ToyGpuScale(Op):
    name = "toy_gpu_scale"
    fields = {"n": Field("int", minimum=1)}

    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec((problem["n"],), "float32")}

    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["n"],), "float32")}

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": 2.0 * np.asarray(inputs["x"], dtype=np.float64)}

    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        return Choice.of("good", {"block": 128})


class _Gpu(Variant):
    op = "toy_gpu_scale"
    backend = "cupy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED


@register_variant
class Good(_Gpu):
    name = "good"
    params = {"block": (128, 256)}

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import cupy as cp

        fn = cp.RawKernel(_SRC, "scale2")
        n, block = problem["n"], int(params["block"])

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            fn(((n + block - 1) // block,), (block,), (inputs["x"], outputs["y"], np.int64(n)))

        return kernel


@register_variant
class Wrong(_Gpu):
    name = "wrong"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            outputs["y"][...] = 3 * inputs["x"]

        return kernel


@register_variant
class IllegalAddress(_Gpu):
    name = "illegal_address"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import cupy as cp

        fn = cp.RawKernel(_SRC, "poke_null")

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            fn((1,), (32,), (outputs["y"],))

        return kernel
