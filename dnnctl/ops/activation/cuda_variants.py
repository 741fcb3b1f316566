"""CUDA activation variants (kernels/activation/): ``exact_grid`` (one pass, grid sized to
the tensor) and ``grid_stride`` (resident blocks loop), each over block size, vector width
(elements per access, up to 16 bytes) and vectors per thread."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.op import ACT_CODE, bias_vec_ok, geometry
from dnnctl.ops.base import (
    SUPPORTED,
    Kernel,
    Problem,
    Support,
    dtype_size,
    unsupported,
)
from dnnctl.ops.registry import register_variant


class _ActKernel(mc.VecKernel):
    """Launches the vector kernel when every pointer is aligned, else the VEC=1 kernel."""

    __slots__ = ()

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y, b = inputs["x"], outputs["y"], inputs.get("bias")
        go = self.fast if mc.aligned(self.align, x, y, b) else self.safe
        go((x, b, y, *self.consts, go.f32(attrs.get("negative_slope", 0.01))))


class _ActCuda(mc.CudaVariant):
    op = "activation"
    kernel: str = ""
    params = {"block": (128, 256, 512), "vec": mc.VECS, "unroll": (1, 2, 4)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return mc.vec_fits(problem["dtype"], params["vec"]) and bias_vec_ok(problem,
                                                                             params["vec"])

    def grid(self, nvec: int, tile: int, params: Mapping[str, Any], device: Any) -> int:
        return max(1, mc.cdiv(nvec, tile))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        n, inner, channels = geometry(problem)
        itype = mc.index_type(n)
        bias = 0 if problem["bias"] == "none" else (1 if problem["layout"] == "NCHW" else 2)
        defines = {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                   "ACT_FN": ACT_CODE[problem["fn"]], "BIAS": bias,
                   "INPLACE": int(problem["inplace"])}

        def name(b: int, v: int, u: int) -> str:
            return f"{self.kernel}<{b},{v},{u},{itype}>"

        block, unroll = params["block"], params["unroll"]
        vec = params["vec"] if self.valid_params(problem, params, device) else 1
        mod = mc.compile_cuda(self.source, defines,
                              [name(block, vec, unroll), name(block, 1, unroll)], device)
        tile = block * unroll
        fast = mc.launch(mod, name(block, vec, unroll), self.grid(n // vec, tile, params, device),
                         block)
        safe = mc.launch(mod, name(block, 1, unroll), self.grid(n, tile, params, device), block)
        sizes = tuple(mc.index_scalar(v, itype) for v in (n, inner, channels))
        return _ActKernel(fast, safe, vec * dtype_size(problem["dtype"]), sizes)


@register_variant
class ActExactGrid(_ActCuda):
    name = "exact_grid"
    source = "activation/exact_grid.cu"
    kernel = "act_exact"
    doc = "one pass; each thread handles `unroll` vectors; grid covers the tensor exactly"

    def supports(self, problem: Problem, device: Any) -> Support:
        if mc.cdiv(math.prod(problem["shape"]), 128) >= 2**31:
            return unsupported("more than 2^31 blocks: use grid_stride")
        return SUPPORTED


@register_variant
class ActGridStride(_ActCuda):
    name = "grid_stride"
    source = "activation/grid_stride.cu"
    kernel = "act_stride"
    doc = "blocks_per_sm x SMs resident blocks loop over the tensor"
    params = {**_ActCuda.params, "blocks_per_sm": (2, 4, 8)}

    def grid(self, nvec: int, tile: int, params: Mapping[str, Any], device: Any) -> int:
        return max(1, min(mc.cdiv(nvec, tile), mc.sm_count(device) * params["blocks_per_sm"]))
