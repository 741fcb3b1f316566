"""conv2d dgrad / wgrad of NCHW tensors run in NHWC on the tensor-core implicit GEMMs, between
layout transposes (kernels/conv2d/transpose.cu), as ``nhwc_implicit_gemm`` does forward.

* ``dgrad_nhwc_implicit_gemm``: dy (N, K, P, Q) -> (N, P, Q, K), w (K, C/g, R, S) ->
  (K, R, S, C/g), ``dgrad_implicit_gemm`` (stride phases) in NHWC, dx back to NCHW;
* ``wgrad_nhwc_implicit_gemm``: x and dy to NHWC, ``wgrad_implicit_gemm`` (split-K over
  N*P*Q, fixed-order sum) in NHWC, dw (K, R, S, C/g) back to (K, C/g, R, S); db as is.

The NCHW gathers load one element at a time (dgrad) or not at all (the wgrad pixel gather is
NHWC only); the transposes cost 2 x (|inputs| + |output|) bytes. Parameters: the inner
variant's, for the NHWC problem.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from dnnctl.ops.base import Kernel, Problem, Support, Variant, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import CudaConv, Workspace, io_dtype
from dnnctl.ops.conv2d.dgrad_phase import DgradImplicitGemm
from dnnctl.ops.conv2d.nhwc_gemm import MAX_BATCH, TILE, nhwc_problem
from dnnctl.ops.conv2d.op import ConvGeom, default_params, geometry
from dnnctl.ops.conv2d.wgrad_implicit_gemm import WgradImplicitGemm
from dnnctl.ops.registry import get_variant, register_variant


class _NhwcBackward(CudaConv):
    source = "conv2d/transpose.cu"
    inner_name: ClassVar[str]

    def inner(self) -> Variant:
        return get_variant("conv2d", "cupy", self.inner_name)

    def supports(self, problem: Problem, device: Any) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        g = geometry(problem)
        if g.nhwc:
            return unsupported(f"the tensors are already NHWC: {self.inner_name} runs them")
        if max(g.n, g.k) > MAX_BATCH:
            return unsupported(f"N and K must be <= {MAX_BATCH} (transpose grid limit)")
        ok = self.inner().supports(nhwc_problem(problem), device)
        return ok if ok else unsupported(f"{self.inner_name} (NHWC): {ok.reason}")

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self.inner().valid_params(nhwc_problem(problem), params, device)

    def param_space(self, problem: Problem, device: Any) -> Any:
        return self.inner().param_space(nhwc_problem(problem), device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        return default_params(self.inner(), nhwc_problem(problem), device)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        own = Workspace(self.pieces(geometry(problem))).nbytes
        return own + self.inner().workspace_bytes(nhwc_problem(problem), params)

    def shapes(self, g: ConvGeom) -> dict[str, tuple[int, ...]]:
        """NHWC shapes of the transposed inputs and of the output, in workspace order."""
        raise NotImplementedError

    def transposes(self, g: ConvGeom) -> tuple[list[tuple[str, int, int, int]],
                                               tuple[str, int, int, int]]:
        """(inputs transposed in: name, batch, rows, cols), the output transposed back."""
        raise NotImplementedError

    def pieces(self, g: ConvGeom) -> list[tuple[str, int, Any]]:
        dt = io_dtype(g)
        return [(name, math.prod(shape), dt) for name, shape in self.shapes(g).items()]

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        inner = self.inner().build(nhwc_problem(problem), params, device)
        launch = self.transposer(g)
        ws = Workspace(self.pieces(g))
        rt = _cuda.runtime()
        shapes = self.shapes(g)
        ins_t, (out_name, *out_dims) = self.transposes(g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            buf = ws.allocate(rt.xp)
            views = {k: buf[k].reshape(shape) for k, shape in shapes.items()}
            for name, batch, rows, cols in ins_t:
                launch(inputs[name], views[name], batch, rows, cols)
            outs = {out_name: views[out_name]}
            outs.update((k, v) for k, v in outputs.items() if k != out_name)  # e.g. db
            inner({name: views[name] for name, *_ in ins_t}, outs, attrs)
            launch(views[out_name], outputs[out_name], *out_dims)

        return kernel

    def transposer(self, g: ConvGeom) -> Any:
        rt = _cuda.runtime()
        fn = rt.function(self.source, {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype]},
                         "transpose_batched")

        def launch(src: Any, dst: Any, batch: int, rows: int, cols: int) -> None:
            tiles = -(-rows // TILE) * -(-cols // TILE)
            fn((tiles, 1, batch), (TILE, 8, 1), (src, dst, dst, *_cuda.i32(rows, cols, 0)))

        return launch


@register_variant
class DgradNhwcImplicitGemm(_NhwcBackward):
    """NCHW dgrad = transposes around the NHWC stride-phase implicit GEMM."""

    name = "dgrad_nhwc_implicit_gemm"
    passes = ("dgrad",)
    inner_name = "dgrad_implicit_gemm"
    params = dict(DgradImplicitGemm.params)
    doc = "dgrad, NCHW via NHWC: transpose dy and w, phased implicit GEMM, transpose dx back"

    def shapes(self, g: ConvGeom) -> dict[str, tuple[int, ...]]:
        return {"dy": (g.n, g.p, g.q, g.k), "w": (g.k, g.r, g.s, g.cg),
                "dx": (g.n, g.h, g.w, g.c)}

    def transposes(self, g: ConvGeom) -> tuple[list[tuple[str, int, int, int]],
                                               tuple[str, int, int, int]]:
        return ([("dy", g.n, g.k, g.p * g.q), ("w", g.k, g.cg, g.r * g.s)],
                ("dx", g.n, g.h * g.w, g.c))


@register_variant
class WgradNhwcImplicitGemm(_NhwcBackward):
    """NCHW wgrad = transposes around the NHWC split-K implicit GEMM (deterministic)."""

    name = "wgrad_nhwc_implicit_gemm"
    passes = ("wgrad",)
    inner_name = "wgrad_implicit_gemm"
    params = dict(WgradImplicitGemm.params)
    doc = "wgrad, NCHW via NHWC: transpose x and dy, split-K implicit GEMM, transpose dw back"

    def shapes(self, g: ConvGeom) -> dict[str, tuple[int, ...]]:
        return {"x": (g.n, g.h, g.w, g.c), "dy": (g.n, g.p, g.q, g.k),
                "dw": (g.k, g.r, g.s, g.cg)}

    def transposes(self, g: ConvGeom) -> tuple[list[tuple[str, int, int, int]],
                                               tuple[str, int, int, int]]:
        return ([("x", g.n, g.c, g.h * g.w), ("dy", g.n, g.k, g.p * g.q)],
                ("dw", g.k, g.r * g.s, g.cg))
