"""conv2d dgrad through the forward kernels, one stride phase at a time.

The data gradient of a stride-(sh, sw) convolution splits into sh * sw phases: input rows
h = a + i*sh meet only the filter rows r with (a + pt - r*dh) divisible by sh, and those
form a flipped sub-filter (step T = sh / gcd(sh, dh), dilation D = dh / gcd(sh, dh)) sliding
over dy with stride 1. Each phase is therefore an ordinary forward convolution of dy (C and
K swapped per group) that a tuned forward variant runs as is: implicit GEMM on tensor cores,
Winograd (3x3 stride 1), FFT, the 1x1 GEMM. No zero insertion, no wasted multiplies; stride
1 is the single phase written straight into dx, larger strides go through a phase buffer and
a scatter (kernels/conv2d/dgrad_phase.cu), phases without taps are zero-filled.

Parameters are the forward variant's; one parameter set serves every phase (it must be
valid for each phase's problem).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from dnnctl.backends import cuda
from dnnctl.ops.base import Kernel, Problem, Support, Variant, np_dtype, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, Workspace
from dnnctl.ops.conv2d.fft import CudaFft
from dnnctl.ops.conv2d.gemm_1x1 import Gemm1x1
from dnnctl.ops.conv2d.implicit_gemm import ImplicitGemm
from dnnctl.ops.conv2d.implicit_gemm_wgmma import ImplicitGemmWgmma
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.conv2d.winograd import CudaWinograd
from dnnctl.ops.registry import get_op, get_variant, register_variant

MAX_PHASES = 16  # beyond this (e.g. patch embeddings) the launches outweigh the GEMMs


@dataclass(frozen=True)
class AxisPhase:
    """One residue class of input rows (or columns) and the filter taps that reach it."""

    a: int  # first input row of the phase
    count: int  # input rows a, a + stride, ... inside the image
    r0: int  # first filter tap of the phase
    step: int  # tap step T
    taps: int  # number of taps (0: nothing reaches these rows)
    dil: int  # the sub-filter's dilation D
    pad0: int  # the phase conv's leading pad (may be < 0: not expressible)
    pad1: int  # trailing pad (>= 0), so that its output covers ``count`` rows
    out: int  # the phase conv's output rows (>= count)


def axis_phases(size: int, out: int, taps: int, stride: int, pad: int, dil: int
                ) -> list[AxisPhase]:
    """The phases of one axis: input ``size``, dy ``out``, filter ``taps``."""
    gcd = math.gcd(stride, dil)
    step, d = stride // gcd, dil // gcd
    phases = []
    for a in range(min(stride, size)):
        count = -(-(size - a) // stride)
        hits = [r for r in range(taps) if (a + pad - r * dil) % stride == 0]
        if not hits:
            phases.append(AxisPhase(a, count, 0, step, 0, d, 0, 0, count))
            continue
        r0, n = hits[0], len(hits)
        off0 = (a + pad - r0 * dil) // stride
        pad0 = (n - 1) * d - off0
        base = out + pad0 - d * (n - 1)
        pad1 = max(0, count - base)
        phases.append(AxisPhase(a, count, r0, step, n, d, pad0, pad1, base + pad1))
    return phases


@dataclass(frozen=True)
class Phase:
    rows: AxisPhase
    cols: AxisPhase
    problem: Problem | None  # the forward problem (None: no taps, zero-fill)


def phases(g: ConvGeom) -> list[Phase] | str:
    """Every (row, column) phase of ``g`` with its forward problem, or why not expressible."""
    op = get_op("conv2d")
    out = []
    for rows in axis_phases(g.h, g.p, g.r, g.sh, g.pt, g.dh):
        for cols in axis_phases(g.w, g.q, g.s, g.sw, g.pl, g.dw):
            if rows.taps == 0 or cols.taps == 0:
                out.append(Phase(rows, cols, None))
                continue
            if rows.pad0 < 0 or cols.pad0 < 0:
                return "padding beyond the dilated filter extent (a negative phase pad)"
            key = dict(n=g.n, c=g.k, h=g.p, w=g.q, k=g.c, r=rows.taps, s=cols.taps,
                       stride=1, pad=(rows.pad0, rows.pad1, cols.pad0, cols.pad1),
                       dilation=(rows.dil, cols.dil), groups=g.groups, dtype=g.dtype,
                       layout=g.layout, tf32=g.tf32)
            out.append(Phase(rows, cols, op.problem(key)))
    return out


def direct_write(g: ConvGeom, ph: list[Phase]) -> bool:
    """One phase whose output is exactly dx: the forward kernel writes dx itself."""
    return len(ph) == 1 and ph[0].problem is not None and (
        ph[0].rows.out, ph[0].cols.out) == (g.h, g.w)


def _main(ph: list[Phase]) -> Problem:
    live = [p for p in ph if p.problem is not None]
    return max(live, key=lambda p: p.rows.count * p.cols.count * p.rows.taps * p.cols.taps
               ).problem  # type: ignore[return-value]


class PhasedDgrad(CudaConv):
    """dgrad as forward convolutions of dy per stride phase, run by a forward variant."""

    passes = ("dgrad",)
    source = "conv2d/dgrad_phase.cu"
    inner: ClassVar[type[Variant]]

    def inner_variant(self) -> Variant:
        return get_variant("conv2d", "cupy", self.inner.name)

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        ph = phases(g)
        if isinstance(ph, str):
            return unsupported(ph)
        if len(ph) > MAX_PHASES:
            return unsupported(f"{len(ph)} stride phases (more than {MAX_PHASES}): "
                               "use dgrad_im2col_gemm")
        if all(p.problem is None for p in ph):
            return unsupported("no filter tap reaches any input pixel")
        inner = self.inner_variant()
        for p in ph:
            if p.problem is not None:
                ok = inner.supports(p.problem, device)
                if not ok:
                    return unsupported(f"phase problem: {ok.reason}")
        return SUPPORTED

    def _live(self, problem: Problem) -> list[Problem]:
        ph = phases(geometry(problem))
        assert not isinstance(ph, str)
        return list(dict.fromkeys(p.problem for p in ph if p.problem is not None))

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        inner = self.inner_variant()
        return all(inner.valid_params(p, params, device) for p in self._live(problem))

    def param_space(self, problem: Problem, device: Any) -> Iterator[dict[str, Any]]:
        ph = phases(geometry(problem))
        assert not isinstance(ph, str)
        for params in self.inner_variant().param_space(_main(ph), device):
            if self.valid_params(problem, params, device):
                yield params

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        from dnnctl.ops.conv2d.op import default_params

        ph = phases(geometry(problem))
        assert not isinstance(ph, str)
        first = default_params(self.inner_variant(), _main(ph), device)
        if first is not None and self.valid_params(problem, first, device):
            return first
        return next(iter(self.param_space(problem, device)), None)

    def workspace(self, g: ConvGeom) -> Workspace:
        ph = phases(g)
        assert not isinstance(ph, str)
        dt = np_dtype(g.dtype)
        direct = direct_write(g, ph)
        pieces: list[tuple[str, int, Any]] = []
        for i, p in enumerate(ph):
            if p.problem is None:
                continue
            pieces.append((f"w{i}", g.c * g.kg * p.rows.taps * p.cols.taps, dt))
            if not direct:
                pieces.append((f"y{i}", g.n * g.c * p.rows.out * p.cols.out, dt))
        return Workspace(pieces)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        inner = self.inner_variant()
        extra = max((inner.workspace_bytes(p, params) for p in self._live(problem)), default=0)
        return self.workspace(geometry(problem)).nbytes + extra

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        ph = phases(g)
        assert not isinstance(ph, str)
        rt = _cuda.runtime()
        defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc)}
        wfn = rt.function(self.source, defines, "phase_weights")
        sfn = rt.function(self.source, defines, "phase_scatter")
        inner = self.inner_variant()
        built = {p: inner.build(p, params, device) for p in self._live(problem)}
        direct = direct_write(g, ph)
        ws = self.workspace(g)
        op = get_op("conv2d")
        block = (256, 1, 1)
        steps = []
        for i, p in enumerate(ph):
            rows, cols = p.rows, p.cols
            scatter = (cuda.Launch(sfn, _cuda.grid1d(g.n * g.c * rows.count * cols.count, 256,
                                                     65535 * 8), block),
                       _cuda.i32(g.n, g.c, g.h, g.w, g.sh, g.sw, rows.a, cols.a, rows.count,
                                 cols.count, rows.out, cols.out, int(p.problem is not None)))
            if p.problem is None:
                steps.append((None, None, "", (), "", (), scatter))
                continue
            wargs = _cuda.i32(g.k, g.c, g.r, g.s, g.groups, rows.r0, rows.step, rows.taps,
                              cols.r0, cols.step, cols.taps)
            wgrid = _cuda.grid1d(g.c * g.kg * rows.taps * cols.taps, 256, 65535)
            steps.append((built[p.problem], (cuda.Launch(wfn, wgrid, block), wargs), f"w{i}",
                          op.input_specs(p.problem)["w"].shape, f"y{i}",
                          op.output_specs(p.problem)["y"].shape, scatter))
        # pointers only where every phase's kernel takes them: the workspace pieces as
        # addresses of one per-call buffer, so a torch caller's tensors are never wrapped;
        # else typed views in the inner kernels' shapes
        flat = all(getattr(k, "flat_io", False) for k in built.values())

        def pieces() -> tuple[Any, dict[str, Any]]:
            return ws.take() if flat else (None, ws.allocate(rt.xp))

        def shaped(a: Any, shape: tuple[int, ...]) -> Any:
            return a if flat else a.reshape(shape)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            dy, w, dx = inputs["dy"], inputs["w"], outputs["dx"]
            held, buf = pieces()  # held to the end: its addresses are in use
            for run, relayout, wname, wshape, yname, yshape, (scat, sargs) in steps:
                if run is None:
                    scat((dx, dx, *sargs))
                    continue
                wp = buf[wname]
                relayout[0]((w, wp, *relayout[1]))
                y = dx if direct else shaped(buf[yname], yshape)
                run({"x": dy, "w": shaped(wp, wshape)}, {"y": y}, {})
                if not direct:
                    scat((y, dx, *sargs))
            del held

        kernel.flat_io = flat  # type: ignore[attr-defined]
        return kernel


def _phased(inner_cls: type[Variant], doc: str) -> type[PhasedDgrad]:
    cls = type(f"Dgrad{inner_cls.__name__}", (PhasedDgrad,), {
        "name": f"dgrad_{inner_cls.name}", "inner": inner_cls, "params": inner_cls.params,
        "doc": doc, "__doc__": doc, "__module__": __name__})
    return register_variant(cls)


DgradImplicitGemm = _phased(ImplicitGemm, "dgrad: per stride phase, the implicit-GEMM forward "
                            "kernel (mma.sync tensor cores / tf32 / fp32) on dy")
DgradImplicitGemmWgmma = _phased(ImplicitGemmWgmma, "dgrad: per stride phase, the Hopper wgmma "
                                 "implicit-GEMM forward kernel on dy (NHWC)")
DgradWinograd = _phased(CudaWinograd, "dgrad: Winograd F(m, 3x3) forward kernel on dy with the "
                        "flipped filter (3x3, stride 1, dilation 1, groups 1)")
DgradFft = _phased(CudaFft, "dgrad: cuFFT forward convolution of dy per stride phase")
DgradGemm1x1 = _phased(Gemm1x1, "dgrad: 1x1 tensor-core GEMM on dy (unpadded 1x1, each "
                       "stride phase with a tap)")
