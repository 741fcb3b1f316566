"""conv2d ``nhwc_implicit_gemm``: an NCHW convolution run in NHWC on the tensor-core implicit
GEMM, between layout transposes (kernels/conv2d/transpose.cu), as cuDNN runs NCHW tensors on
its NHWC tensor-core kernels.

Per call: x (N, C, H, W) -> (N, H, W, C) and w (K, C/g, R, S) -> (K, R, S, C/g) into a
workspace; the ``implicit_gemm`` variant computes act(conv + bias) in NHWC with its vectorized
patch gather (the NCHW gather loads one element at a time); y (N, P, Q, K) -> (N, K, P, Q),
adding the residual on the way (the one epilogue step left outside the GEMM; with a residual
the output is rounded twice, as an unfused residual add would). The transposes move 2 x
(|x| + |y|) bytes, which the faster GEMM repays on all but the smallest convolutions.
Parameters: those of ``implicit_gemm`` for the NHWC problem (its space, rules and default).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from dnnctl.ops.base import Kernel, Problem, Support, Variant, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import CudaConv, Workspace, io_dtype
from dnnctl.ops.conv2d.implicit_gemm import ImplicitGemm
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import get_op, get_variant, register_variant

TILE = 32  # transpose tile edge (kernels/conv2d/transpose.cu)
MAX_BATCH = 65535  # grid z of the transposes: images, output channels


@functools.lru_cache(maxsize=1024)
def nhwc_problem(problem: Problem) -> Problem:
    """The same convolution in NHWC without the residual (added by the last transpose)."""
    return get_op("conv2d").problem(dict(problem.as_dict(), layout="NHWC", residual=False))


def _inner() -> Variant:
    return get_variant("conv2d", "cupy", "implicit_gemm")


def is_plain_1x1(g: ConvGeom) -> bool:
    return (g.r, g.s, g.sh, g.sw, g.pt, g.pb, g.pl, g.pr, g.groups) == (1, 1, 1, 1, 0, 0, 0, 0, 1)


@register_variant
class NhwcImplicitGemm(CudaConv):
    """NCHW convolution = transpose in, NHWC implicit GEMM, transpose out."""

    name = "nhwc_implicit_gemm"
    source = "conv2d/transpose.cu"
    doc = ("NCHW via NHWC: transpose x and w, tensor-core implicit GEMM with fused bias and "
           "activation, transpose y back adding the residual")
    params = dict(ImplicitGemm.params)

    def supports(self, problem: Problem, device: Any) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        g = geometry(problem)
        if g.nhwc:
            return unsupported("the tensors are already NHWC: implicit_gemm runs them directly")
        if is_plain_1x1(g):
            return unsupported("1x1 stride-1 NCHW is one GEMM per image: gemm_1x1 reads it "
                               "in place, no transpose needed")
        if g.n > MAX_BATCH or g.k > MAX_BATCH:
            return unsupported(f"N and K must be <= {MAX_BATCH} (transpose grid limit)")
        inner = _inner().supports(nhwc_problem(problem), device)
        if not inner:
            return unsupported(f"implicit_gemm (NHWC): {inner.reason}")
        return inner

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return _inner().valid_params(nhwc_problem(problem), params, device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        inner = _inner()
        return inner.default_params(nhwc_problem(problem), device)  # type: ignore[attr-defined]

    def workspace(self, g: ConvGeom) -> Workspace:
        dt = io_dtype(g)
        return Workspace([("x", g.n * g.h * g.w * g.c, dt), ("w", g.k * g.r * g.s * g.cg, dt),
                          ("y", g.n * g.p * g.q * g.k, dt)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        own = self.workspace(geometry(problem)).nbytes
        return own + _inner().workspace_bytes(nhwc_problem(problem), params)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        inner_problem = nhwc_problem(problem)
        gemm = _inner().build(inner_problem, params, device)
        rt = _cuda.runtime()
        fn = rt.function(self.source, {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype]},
                         "transpose_batched")
        ws = self.workspace(g)
        block = (TILE, 8, 1)

        def launch(src: Any, dst: Any, add: Any, batch: int, rows: int, cols: int) -> None:
            tiles = -(-rows // TILE) * -(-cols // TILE)
            has_add = add is not None
            fn((tiles, 1, batch), block,
               (src, dst, add if has_add else dst, *_cuda.i32(rows, cols, int(has_add))))

        shapes = {"x": (g.n, g.h, g.w, g.c), "w": (g.k, g.r, g.s, g.cg),
                  "y": (g.n, g.p, g.q, g.k)}

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            buf = ws.allocate(rt.xp)
            xt, wt, yt = (buf[k].reshape(shapes[k]) for k in ("x", "w", "y"))
            launch(inputs["x"], xt, None, g.n, g.c, g.h * g.w)
            launch(inputs["w"], wt, None, g.k, g.cg, g.r * g.s)
            inner_in = {"x": xt, "w": wt}
            if g.bias:
                inner_in["bias"] = inputs["bias"]
            gemm(inner_in, {"y": yt}, attrs)
            launch(yt, outputs["y"], inputs["residual"] if g.residual else None, g.n,
                   g.p * g.q, g.k)

        return kernel
