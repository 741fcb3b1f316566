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

from dnnctl.ops.conv2d.dgrad_phase import DgradImplicitGemm
from dnnctl.ops.conv2d.nhwc_gemm import ViaNhwc
from dnnctl.ops.conv2d.wgrad_implicit_gemm import WgradImplicitGemm
from dnnctl.ops.registry import register_variant


@register_variant
class DgradNhwcImplicitGemm(ViaNhwc):
    """NCHW dgrad = transposes around the NHWC stride-phase implicit GEMM."""

    name = "dgrad_nhwc_implicit_gemm"
    passes = ("dgrad",)
    inner_name = "dgrad_implicit_gemm"
    params = dict(DgradImplicitGemm.params)
    doc = "dgrad, NCHW via NHWC: transpose dy and w, phased implicit GEMM, transpose dx back"
    transposed = ("dy", "w")
    out = "dx"


@register_variant
class WgradNhwcImplicitGemm(ViaNhwc):
    """NCHW wgrad = transposes around the NHWC split-K implicit GEMM (deterministic)."""

    name = "wgrad_nhwc_implicit_gemm"
    passes = ("wgrad",)
    inner_name = "wgrad_implicit_gemm"
    params = dict(WgradImplicitGemm.params)
    doc = "wgrad, NCHW via NHWC: transpose x and dy, split-K implicit GEMM, transpose dw back"
    transposed = ("x", "dy")
    out = "dw"
