"""conv2d ``fft``: cuFFT convolution for large filters (kernels/conv2d/fft.cu + cuFFT + cuBLAS).

Per call: embed the dilated filters into Hf x Wf planes and rfft2 them; per chunk of images:
zero-pad the input into Hf x Wf planes, rfft2, multiply-accumulate over input channels as one
complex GEMM per frequency (cuBLAS strided batched, Y_f = X_f W_f^H, per group), irfft2, then
crop (stride) + scale + epilogue into y. All math is fp32 / complex64; cost does not grow with
R*S. The transforms write frequency-major (advanced layout), so the GEMM operands are plain
row-major matrices per frequency.

Workspace (exact, what one call allocates): one real fp32 buffer shared by the filter planes,
the padded inputs and the inverse transforms, plus the complex spectra of filters, inputs and
outputs. The cuFFT plans' own work areas are allocated when the kernel is built and are held
by it (cuFFT sizes them; see ``plan_work_bytes``).
Parameters: ``size`` (transform length: next 2^a3^b5^c7^d, or next power of two), ``chunk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import (
    SUPPORTED,
    CudaConv,
    Workspace,
    batch_chunk,
    image_chunks,
    next_pow2,
)
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

DEFAULT_WS_LIMIT = 2 << 30


def smooth_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c 7^d >= n (cuFFT's fast radices)."""
    m = n
    while True:
        v = m
        for f in (2, 3, 5, 7):
            while v % f == 0:
                v //= f
        if v == 1:
            return m
        m += 1


@register_variant
class CudaFft(CudaConv):
    """FFT convolution: cost independent of the filter size."""

    name = "fft"
    source = "conv2d/fft.cu"
    doc = "cuFFT rfft2 of input and dilated filters, complex GEMM over C per frequency, irfft2"
    params = {"size": ("smooth", "pow2"), "chunk": (0, 1, 4, 16)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if g.r * g.s == 1:
            return unsupported("1x1 filters: FFT cannot win (use gemm_1x1 / im2col_gemm)")
        return SUPPORTED

    def fft_shape(self, g: ConvGeom, size: str) -> tuple[int, int]:
        hp, wp = g.h + g.pt + g.pb, g.w + g.pl + g.pr
        fn = smooth_len if size == "smooth" else next_pow2
        return fn(hp), fn(wp)

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        chunk = params["chunk"]
        if chunk and chunk >= g.n:
            return False
        if params["size"] == "pow2":
            return self.fft_shape(g, "pow2") != self.fft_shape(g, "smooth")
        return True

    def workspace(self, g: ConvGeom, params: Mapping[str, Any]) -> Workspace:
        hf, wf = self.fft_shape(g, params["size"])
        freqs = hf * (wf // 2 + 1)
        nc = batch_chunk(g, params["chunk"])
        planes = max(g.k * g.cg, nc * g.c, nc * g.k)
        return Workspace([("real", planes * hf * wf, np.float32),
                          ("Wc", freqs * g.k * g.cg, np.complex64),
                          ("X", freqs * nc * g.c, np.complex64),
                          ("Y", freqs * nc * g.k, np.complex64)])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return self.workspace(geometry(problem), params).nbytes

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        picks = ({"size": "smooth", "chunk": chunk} for chunk in (0, 16, 4, 1))
        return self.first_valid(problem, device, picks, DEFAULT_WS_LIMIT)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc)}
        f_filter = rt.function(self.source, defines, "fft_filter")
        f_pad = rt.function(self.source, defines, "fft_pad")
        f_crop = rt.function(self.source, defines, "fft_crop")
        hf, wf = self.fft_shape(g, params["size"])
        wh = wf // 2 + 1
        freqs, plane = hf * wh, hf * wf
        nc = batch_chunk(g, params["chunk"])
        chunks = image_chunks(g, params["chunk"])
        ws = self.workspace(g, params)
        scale = np.float32(1.0 / plane)
        block = (256, 1, 1)

        def forward(batch: int) -> Any:  # real planes -> frequency-major spectra
            return rt.fft_plan((hf, wf), (hf, wf), 1, plane, (hf, wh), batch, 1,
                               _cuda.CUFFT_R2C, batch)

        def inverse(batch: int) -> Any:  # frequency-major spectra -> real planes
            return rt.fft_plan((hf, wf), (hf, wh), batch, 1, (hf, wf), 1, plane,
                               _cuda.CUFFT_C2R, batch)

        plans: dict[tuple[str, int], Any] = {}

        def plan(kind: str, batch: int) -> Any:
            if (kind, batch) not in plans:
                plans[(kind, batch)] = (forward if kind == "f" else inverse)(batch)
            return plans[(kind, batch)]

        plan("f", g.k * g.cg)
        plan("f", nc * g.c)
        plan("i", nc * g.k)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            buf = ws.allocate(rt.xp)
            real, wc, xc, yc = buf["real"], buf["Wc"], buf["X"], buf["Y"]
            f_filter(_cuda.grid1d(g.k * g.cg * plane, 256), block,
                     (inputs["w"], real, *_cuda.i32(g.k, g.cg, g.r, g.s, g.dh, g.dw, hf, wf)))
            rt.fft_exec(plan("f", g.k * g.cg), real, wc, _cuda.CUFFT_FORWARD)
            bias, res, act, flags = _cuda.epilogue_args(g, y, inputs)
            for n0, cnt in chunks:
                f_pad(_cuda.grid1d(cnt * g.c * plane, 256), block,
                      (x, real, *_cuda.i32(n0, cnt, g.c, g.h, g.w, g.pt, g.pl, hf, wf)))
                rt.fft_exec(plan("f", cnt * g.c), real, xc, _cuda.CUFFT_FORWARD)
                for grp in range(g.groups):  # Y_f[n, k] = sum_c X_f[n, c] conj(W_f[k, c])
                    _cuda.gemm_rowmajor(
                        rt, cnt, g.kg, g.cg, xc, grp * g.cg, g.c, cnt * g.c, False,
                        wc, grp * g.kg * g.cg, g.cg, g.k * g.cg, True,
                        yc, grp * g.kg, g.k, cnt * g.k, batch=freqs, b_conj=True)
                rt.fft_exec(plan("i", cnt * g.k), yc, real, _cuda.CUFFT_INVERSE)
                f_crop(_cuda.grid1d(cnt * g.k * g.p * g.q, 256), block,
                       (real, y, bias, res, *_cuda.i32(n0, cnt, g.k, g.p, g.q, g.sh, g.sw, hf,
                                                       wf), scale, act, flags))

        kernel.plans = plans  # type: ignore[attr-defined]
        return kernel


def plan_work_bytes(kernel: Any) -> int:
    """Bytes of cuFFT work area held by a built fft kernel's plans (0 when unknown)."""
    total = 0
    for p in getattr(kernel, "plans", {}).values():
        area = getattr(p, "work_area", None)
        mem = getattr(area, "mem", None)
        total += int(getattr(mem, "size", 0) or 0)
    return total
