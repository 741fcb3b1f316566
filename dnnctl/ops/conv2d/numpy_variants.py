"""conv2d on the numpy backend: three real algorithms with different costs by shape.

* ``im2col_gemm`` — one (N*P*Q, R*S*C/g) patch matrix, one BLAS GEMM per group: best for
  ordinary convolutions with many channels.
* ``direct`` — loop over the R*S filter taps, multiply-accumulating one strided view of the
  input per tap: no patch matrix, so it wins for depthwise and small-group convolutions and
  for small filters on large images.
* ``fft`` — rfft2 of input and filters, a complex GEMM over channels per frequency, irfft2:
  cost independent of R*S, so it wins for large filters.

All compute in float32 (fp16/bf16 inputs are upcast) and apply the fused epilogue in float32.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

# ----------------------------------------------------------------------------- helpers


def erf32(x: np.ndarray) -> np.ndarray:
    """erf in float32 to ~2e-7 absolute (Abramowitz & Stegun 7.1.26 refined), vectorized."""
    a = np.abs(x).astype(np.float32)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.5) * a)
    # Numerical Recipes erfc: fractional error < 1.2e-7 everywhere
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (
        0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (
            1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    with np.errstate(under="ignore"):
        erfc = t * np.exp(poly.astype(np.float32))
    return np.copysign(np.float32(1.0) - erfc, x).astype(np.float32)


def epilogue32(y: np.ndarray, g: ConvGeom, inputs: Mapping[str, Any], nhwc: bool) -> np.ndarray:
    """+ bias, activation, + residual (before the activation with residual_before_act) on a
    float32 result laid out NHWC (``nhwc``) or NCHW; returns it in the problem's layout."""
    if nhwc != g.nhwc:
        y = y.transpose(0, 2, 3, 1) if g.nhwc else y.transpose(0, 3, 1, 2)
    if g.bias:
        b = inputs["bias"].astype(np.float32)
        y = y + (b if g.nhwc else b.reshape(g.k, 1, 1))
    if g.residual_before_act:
        y = y + inputs["residual"].astype(np.float32)
    if g.activation == "relu":
        y = np.where(y > 0, y, np.where(np.isnan(y), y, np.float32(0.0)))
    elif g.activation == "gelu":
        y = np.float32(0.5) * y * (np.float32(1.0) + erf32(y * np.float32(1 / math.sqrt(2))))
    elif g.activation == "silu":
        with np.errstate(over="ignore"):
            y = y / (np.float32(1.0) + np.exp(-y))
    elif g.activation == "relu6":
        y = np.minimum(np.maximum(y, np.float32(0.0)), np.float32(6.0))
    elif g.activation == "hardswish":
        y = y * np.minimum(np.maximum(y + np.float32(3.0), np.float32(0.0)),
                           np.float32(6.0)) / np.float32(6.0)
    if g.residual and not g.residual_before_act:
        y = y + inputs["residual"].astype(np.float32)
    return y


def padded_nhwc(x: np.ndarray, g: ConvGeom) -> np.ndarray:
    """The input as padded float32 NHWC (N, Hp, Wp, C)."""
    x32 = x.astype(np.float32)
    if not g.nhwc:
        x32 = x32.transpose(0, 2, 3, 1)
    return np.pad(x32, ((0, 0), (g.pt, g.pb), (g.pl, g.pr), (0, 0)))


def weights_rsck(w: np.ndarray, g: ConvGeom) -> np.ndarray:
    """Weights as float32 (R, S, C/g, K)."""
    w32 = w.astype(np.float32)
    return w32.transpose(1, 2, 3, 0) if g.nhwc else w32.transpose(2, 3, 1, 0)


def tap(xp: np.ndarray, g: ConvGeom, r: int, s: int, n0: int = 0, n1: int | None = None
        ) -> np.ndarray:
    """Strided view (n, P, Q, C) of the padded NHWC input under filter tap (r, s)."""
    h0, w0 = r * g.dh, s * g.dw
    return xp[n0:n1, h0:h0 + (g.p - 1) * g.sh + 1:g.sh, w0:w0 + (g.q - 1) * g.sw + 1:g.sw, :]


def patches(xp: np.ndarray, g: ConvGeom, n0: int, n1: int) -> np.ndarray:
    """The patch matrix of images n0:n1 of the padded NHWC input: one row per output pixel,
    as (rows, R*S, groups, C/g)."""
    cols = np.stack([tap(xp, g, r, s, n0, n1) for r in range(g.r) for s in range(g.s)],
                    axis=3)  # (n, P, Q, RS, C)
    return cols.reshape(-1, g.r * g.s, g.groups, g.cg)


class NumpyConv(Variant):
    """Base of the numpy conv2d variants, forward and backward: they take every problem."""

    op = "conv2d"
    backend = "numpy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED


Ranges = list[tuple[int, int]]  # (first image, end) of each step of a call


class ByImages(NumpyConv):
    """Variants whose call steps through ranges of images (:meth:`ranges`, fixed when the
    kernel is built), computing in :meth:`run`."""

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        ranges = self.ranges(g, params)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            self.run(g, ranges, inputs, outputs)

        return kernel

    @abstractmethod
    def ranges(self, g: ConvGeom, params: Mapping[str, Any]) -> Ranges: ...

    @abstractmethod
    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        """One call: inputs to outputs, image range (n0, n1) by image range."""


class ChunkedIm2col(ByImages):
    """The patch / column matrix variants: ``chunk`` images at a time (0: the whole batch),
    their matrix (images x P x Q x R x S x C, fp32) the workspace."""

    params = {"chunk": (0, 1, 8)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        chunk = params["chunk"]
        return chunk == 0 or chunk < problem["n"]

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        imgs = g.n if params["chunk"] == 0 else min(params["chunk"], g.n)
        return imgs * g.p * g.q * g.r * g.s * g.c * 4

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        return {"chunk": 0}

    def ranges(self, g: ConvGeom, params: Mapping[str, Any]) -> Ranges:
        step = g.n if params["chunk"] == 0 else params["chunk"]
        return [(n0, min(n0 + step, g.n)) for n0 in range(0, g.n, step)]


class TapOrder(ByImages):
    """The tap-by-tap variants: ``order`` of the loop nest, taps outermost (the whole batch
    at once, the default) or images outermost (one at a time)."""

    params: ClassVar[dict[str, tuple[Any, ...]]] = {"order": ("tap", "image")}

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        return {"order": "tap"}

    def ranges(self, g: ConvGeom, params: Mapping[str, Any]) -> Ranges:
        return [(i, i + 1) for i in range(g.n)] if params["order"] == "image" else [(0, g.n)]


# ----------------------------------------------------------------------------- im2col


class _Forward(ByImages):
    """A forward variant's call: padded NHWC input and (R, S, C/g, K) weights in float32,
    the outputs of each image range added up by :meth:`add` into a float32 NHWC result, then
    the epilogue."""

    def run(self, g: ConvGeom, ranges: Ranges, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> None:
        xp = padded_nhwc(inputs["x"], g)
        wt = self.weights(g, weights_rsck(inputs["w"], g))
        y = np.zeros((g.n, g.p, g.q, g.k), np.float32)
        for n0, n1 in ranges:
            self.add(g, xp, wt, y[n0:n1], n0, n1)
        outputs["y"][...] = epilogue32(y, g, inputs, nhwc=True)

    def weights(self, g: ConvGeom, wt: np.ndarray) -> np.ndarray:
        """The weights as :meth:`add` takes them (once per call)."""
        return wt

    @abstractmethod
    def add(self, g: ConvGeom, xp: np.ndarray, wt: np.ndarray, y: np.ndarray, n0: int,
            n1: int) -> None:
        """y (images n0:n1 of the result) += the convolution of those images."""


@register_variant
class NumpyIm2colGemm(_Forward, ChunkedIm2col):
    """im2col patch matrix + one BLAS GEMM per group, ``chunk`` images at a time."""

    name = "im2col_gemm"
    doc = "patch matrix (N*P*Q, R*S*C/g) times weights (R*S*C/g, K/g) with BLAS"

    def weights(self, g: ConvGeom, wt: np.ndarray) -> np.ndarray:
        wm = wt.reshape(g.r * g.s, g.cg, g.groups, g.kg)
        return wm.transpose(2, 0, 1, 3).reshape(g.groups, g.r * g.s * g.cg, g.kg)

    def add(self, g: ConvGeom, xp: np.ndarray, wt: np.ndarray, y: np.ndarray, n0: int,
            n1: int) -> None:
        cols = patches(xp, g, n0, n1)
        if g.groups == 1:
            prod = cols.reshape(cols.shape[0], -1) @ wt[0]
        else:
            cols = cols.transpose(2, 0, 1, 3).reshape(g.groups, cols.shape[0], -1)
            prod = np.matmul(cols, wt).transpose(1, 0, 2)
        y += prod.reshape(y.shape)


# ----------------------------------------------------------------------------- direct


@register_variant
class NumpyDirect(_Forward, TapOrder):
    """Tap-by-tap multiply-accumulate: R*S small GEMMs (or broadcasts when C/g == 1)."""

    name = "direct"
    doc = "loop over R*S filter taps; strided input view times the tap's weights"

    def add(self, g: ConvGeom, xp: np.ndarray, wt: np.ndarray, y: np.ndarray, n0: int,
            n1: int) -> None:
        for r in range(g.r):
            for s in range(g.s):
                view = tap(xp, g, r, s, n0, n1)
                wrs = wt[r, s]  # (C/g, K)
                if g.cg == 1:  # depthwise-like: out channel k reads channel k // (K/C)
                    src = view if g.kg == 1 else np.repeat(view, g.kg, axis=3)
                    y += src * wrs[0]
                elif g.groups == 1:
                    y += view @ wrs
                else:
                    v = view.reshape(*view.shape[:3], g.groups, g.cg)
                    wg = wrs.reshape(g.cg, g.groups, g.kg).transpose(1, 0, 2)
                    y += np.einsum("npqgc,gck->npqgk", v, wg,
                                   optimize=True).reshape(y.shape)


# ----------------------------------------------------------------------------- fft


def fast_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (sizes pocketfft transforms quickly)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


@register_variant
class NumpyFft(NumpyConv):
    """FFT convolution: rfft2, complex multiply-accumulate over channels, irfft2, crop."""

    name = "fft"
    doc = "rfft2 of padded input and dilated filters, complex GEMM over C per frequency"
    params = {"size": ("fast", "exact")}  # transform length: next 2^a3^b5^c, or exactly Hp x Wp

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        return {"size": "fast"}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if params["size"] == "fast":
            return True
        g = geometry(problem)
        hp, wp = g.h + g.pt + g.pb, g.w + g.pl + g.pr
        return (fast_len(hp), fast_len(wp)) != (hp, wp)  # else identical to "fast"

    def fft_shape(self, g: ConvGeom, size: str) -> tuple[int, int]:
        hp, wp = g.h + g.pt + g.pb, g.w + g.pl + g.pr
        return (fast_len(hp), fast_len(wp)) if size == "fast" else (hp, wp)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        hf, wf = self.fft_shape(g, params["size"])
        freqs = hf * (wf // 2 + 1)
        # complex64 spectra of input, filters and output
        return 8 * freqs * (g.n * g.c + g.k * g.cg + g.n * g.k)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        hf, wf = self.fft_shape(g, params["size"])
        rd, sd = (g.r - 1) * g.dh + 1, (g.s - 1) * g.dw + 1

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            xp = padded_nhwc(inputs["x"], g).transpose(0, 3, 1, 2)  # (N, C, Hp, Wp)
            wt = weights_rsck(inputs["w"], g).transpose(3, 2, 0, 1)  # (K, C/g, R, S)
            wd = np.zeros((g.k, g.cg, rd, sd), np.float32)
            wd[:, :, ::g.dh, ::g.dw] = wt
            xf = np.fft.rfft2(xp, s=(hf, wf))  # (N, C, F1, F2)
            wf_ = np.conj(np.fft.rfft2(wd, s=(hf, wf)))  # correlation = conj in frequency
            f1, f2 = xf.shape[2], xf.shape[3]
            xf = xf.reshape(g.n, g.groups, g.cg, f1 * f2).transpose(1, 3, 0, 2)  # G,F,N,Cg
            wf_ = wf_.reshape(g.groups, g.kg, g.cg, f1 * f2).transpose(0, 3, 2, 1)  # G,F,Cg,Kg
            yf = np.matmul(xf, wf_)  # (G, F, N, Kg)
            yf = yf.transpose(2, 0, 3, 1).reshape(g.n, g.k, f1, f2)
            full = np.fft.irfft2(yf, s=(hf, wf))
            y = full[:, :, :(g.p - 1) * g.sh + 1:g.sh, :(g.q - 1) * g.sw + 1:g.sw]
            outputs["y"][...] = epilogue32(y.astype(np.float32), g, inputs, nhwc=False)

        return kernel
