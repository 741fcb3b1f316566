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
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from dnnctl.ops.base import Kernel, Problem, Support, Variant, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import CudaConv, Workspace, io_dtype
from dnnctl.ops.conv2d.implicit_gemm import ImplicitGemm
from dnnctl.ops.conv2d.op import ConvGeom, default_params, geometry
from dnnctl.ops.registry import get_op, get_variant, register_variant

TILE = 32  # transpose tile edge (kernels/conv2d/transpose.cu)
MAX_BATCH = 65535  # grid z of the transposes: images, output channels


@functools.lru_cache(maxsize=1024)
def nhwc_problem(problem: Problem) -> Problem:
    """The same convolution in NHWC without the residual (added by the last transpose)."""
    return get_op("conv2d").problem(dict(problem.as_dict(), layout="NHWC", residual=False))


def is_plain_1x1(g: ConvGeom) -> bool:
    return (g.r, g.s, g.sh, g.sw, g.pt, g.pb, g.pl, g.pr, g.groups) == (1, 1, 1, 1, 0, 0, 0, 0, 1)


def tensor_dims(g: ConvGeom, name: str) -> tuple[int, int, tuple[int, int]]:
    """(batch, channels, spatial extent) of a conv2d tensor: x / dx are (N, C, H, W), w / dw
    (K, C/g, R, S), y / dy (N, K, P, Q) in NCHW; NHWC puts the channels last."""
    if name in ("x", "dx"):
        return g.n, g.c, (g.h, g.w)
    if name in ("w", "dw"):
        return g.k, g.cg, (g.r, g.s)
    return g.n, g.k, (g.p, g.q)


class ViaNhwc(CudaConv):
    """An NCHW problem run by the NHWC variant ``inner_name`` between layout transposes:
    the inputs named in ``transposed`` in, the output ``out`` back (adding the residual on
    the way); other inputs and outputs (bias, db) pass as they are. Parameters: the inner
    variant's, for the NHWC problem."""

    source = "conv2d/transpose.cu"
    inner_name: ClassVar[str]
    transposed: ClassVar[tuple[str, ...]]
    out: ClassVar[str]

    def inner(self) -> Variant:
        return get_variant("conv2d", "cupy", self.inner_name)

    def supports(self, problem: Problem, device: Any) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        g = geometry(problem)
        if g.nhwc:
            return unsupported(f"the tensors are already NHWC: {self.inner_name} runs them "
                               "directly")
        if g.residual_before_act:
            return unsupported("the residual is added by the transpose back, after the "
                               "activation: residual_before_act needs it before")
        no = self.layout_unsupported(g)
        if no is not None:
            return no
        if max(g.n, g.k) > MAX_BATCH:
            return unsupported(f"N and K must be <= {MAX_BATCH} (transpose grid limit)")
        ok = self.inner().supports(nhwc_problem(problem), device)
        return ok if ok else unsupported(f"{self.inner_name} (NHWC): {ok.reason}")

    def layout_unsupported(self, g: ConvGeom) -> Support | None:
        """Why an NCHW problem is better left to another variant, else None."""
        return None

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self.inner().valid_params(nhwc_problem(problem), params, device)

    def param_space(self, problem: Problem, device: Any) -> Any:
        return self.inner().param_space(nhwc_problem(problem), device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        return default_params(self.inner(), nhwc_problem(problem), device)

    def shapes(self, g: ConvGeom) -> dict[str, tuple[int, ...]]:
        """NHWC shapes of the transposed inputs and of the output, in workspace order."""
        out = {}
        for name in (*self.transposed, self.out):
            batch, channels, spatial = tensor_dims(g, name)
            out[name] = (batch, *spatial, channels)
        return out

    def workspace(self, g: ConvGeom) -> Workspace:
        dt = io_dtype(g)
        return Workspace([(name, math.prod(shape), dt) for name, shape in self.shapes(g).items()])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        own = self.workspace(geometry(problem)).nbytes
        return own + self.inner().workspace_bytes(nhwc_problem(problem), params)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        inner = self.inner().build(nhwc_problem(problem), params, device)
        launch = transposer(g)
        ws = self.workspace(g)
        rt = _cuda.runtime()
        shapes = self.shapes(g)
        # (batch, rows, cols) of each transpose: channels <-> spatial, one image at a time
        dims = {name: tensor_dims(g, name) for name in shapes}
        into = {name: (b, c, math.prod(sp)) for name, (b, c, sp) in dims.items()}
        b, c, sp = dims[self.out]
        back = (b, math.prod(sp), c)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            buf = ws.allocate(rt.xp)
            views = {name: buf[name].reshape(shape) for name, shape in shapes.items()}
            inner_in = {k: v for k, v in inputs.items() if k != "residual"}
            for name in self.transposed:
                launch(inputs[name], views[name], None, *into[name])
                inner_in[name] = views[name]
            inner_out = dict(outputs)
            inner_out[self.out] = views[self.out]
            inner(inner_in, inner_out, attrs)
            launch(views[self.out], outputs[self.out],
                   inputs["residual"] if g.residual else None, *back)

        return kernel


def transposer(g: ConvGeom) -> Any:
    """``launch(src, dst, add, batch, rows, cols)``: dst[b] = src[b]^T (+ add, when not
    None) for ``batch`` row-major (rows x cols) matrices (kernels/conv2d/transpose.cu)."""
    fn = _cuda.runtime().function("conv2d/transpose.cu",
                                  {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype]},
                                  "transpose_batched")

    def launch(src: Any, dst: Any, add: Any, batch: int, rows: int, cols: int) -> None:
        tiles = -(-rows // TILE) * -(-cols // TILE)
        has_add = add is not None
        fn((tiles, 1, batch), (TILE, 8, 1),
           (src, dst, add if has_add else dst, *_cuda.i32(rows, cols, int(has_add))))

    return launch


@register_variant
class NhwcImplicitGemm(ViaNhwc):
    """NCHW convolution = transpose in, NHWC implicit GEMM, transpose out."""

    name = "nhwc_implicit_gemm"
    doc = ("NCHW via NHWC: transpose x and w, tensor-core implicit GEMM with fused bias and "
           "activation, transpose y back adding the residual")
    params = dict(ImplicitGemm.params)
    inner_name = "implicit_gemm"
    transposed = ("x", "w")
    out = "y"

    def layout_unsupported(self, g: ConvGeom) -> Support | None:
        if is_plain_1x1(g):
            return unsupported("1x1 stride-1 NCHW is one GEMM per image: gemm_1x1 reads it "
                               "in place, no transpose needed")
        return None
