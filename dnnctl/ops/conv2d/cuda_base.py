"""Common ground of the CUDA (cupy backend) conv2d variants: support checks, workspace
carving, batch chunks, the stand-alone epilogue kernel, the kernel of a launch with the
epilogue fused, and parameter helpers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.ops.base import SUPPORTED, Problem, Support, Variant, np_dtype, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.op import ConvGeom, geometry

INT_MAX = 2**31 - 1
ALIGN = 256  # every workspace piece starts 256-byte aligned (cuBLAS / vector access friendly)


def next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def batch_chunk(g: ConvGeom, chunk: int) -> int:
    """Images per pass of a chunked variant: ``chunk`` 0 means the whole batch."""
    return g.n if chunk == 0 else min(chunk, g.n)


def image_chunks(g: ConvGeom, chunk: int) -> list[tuple[int, int]]:
    """(first image, images) of each pass of a chunked variant over the batch."""
    nc = batch_chunk(g, chunk)
    return [(n0, min(nc, g.n - n0)) for n0 in range(0, g.n, nc)]


def align(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


class Workspace:
    """One device allocation carved into typed 1-D pieces (the sizes workspace_bytes counts)."""

    def __init__(self, pieces: list[tuple[str, int, Any]]):
        self.pieces = pieces  # (name, elements, numpy dtype)
        self.offsets: dict[str, int] = {}  # each piece's byte offset in the buffer
        off = 0
        for name, n, dt in pieces:
            self.offsets[name] = off
            off += align(n * np.dtype(dt).itemsize)
        self.nbytes = off

    def allocate(self, xp: Any) -> dict[str, Any]:
        """Carve one per-call buffer (the caller's allocator, see backends.cuda.scratch)."""
        size = max(self.nbytes, 1)
        buf = xp.empty(size, dtype=np.uint8) if xp is np else cuda.scratch(size, np.uint8)
        return self.carve(buf)

    def carve(self, buf: Any) -> dict[str, Any]:
        """Typed 1-D views of the pieces of ``buf`` (a uint8 array of :attr:`nbytes`)."""
        return {name: buf[off:off + n * np.dtype(dt).itemsize].view(dt)
                for (name, n, dt), off in zip(self.pieces, self.offsets.values())}

    def take(self) -> tuple[Any, dict[str, Any]]:
        """``(buffer, {piece: device address})`` of a new per-call buffer: the caller's own
        array kind, no views made (for kernels that take pointers); views under the CPU
        emulator, whose launches check every access against the arrays they are given. The
        caller holds ``buffer`` until its last launch is issued: freed earlier, its memory
        could be handed to a later allocation of the same call."""
        buf = cuda.workspace((max(self.nbytes, 1),), np.uint8)
        if isinstance(buf, np.ndarray):
            return buf, self.carve(buf)
        base = cuda.ptr(buf)
        return buf, {name: base + off for name, off in self.offsets.items()}


class CudaConv(Variant):
    """Base of the cupy conv2d variants."""

    op = "conv2d"
    backend = "cupy"

    def supports(self, problem: Problem, device: Any) -> Support:
        g = geometry(problem)
        cc = getattr(device, "cc_tuple", (0, 0))
        if cc and cc < (8, 0) and g.dtype == "bfloat16":
            return unsupported("bfloat16 needs compute capability 8.0 or newer")
        if g.npq > INT_MAX or g.n * g.c * g.h * g.w > INT_MAX or g.n * g.k * g.p * g.q > INT_MAX:
            return unsupported("tensors above 2^31 elements are not supported")
        return self.supports_geom(g, device)

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        return SUPPORTED


def epilogue_vec(g: ConvGeom) -> int:
    """Elements per access of the stand-alone epilogue: up to 16 bytes, and no vector across
    a channel boundary (NHWC: K a multiple of it; NCHW: P*Q a multiple of it)."""
    v = 16 // np_dtype(g.dtype).itemsize
    extent = g.k if g.nhwc else g.p * g.q
    while v > 1 and extent % v:
        v //= 2
    return v


class Epilogue:
    """The in-place epilogue kernel y = residual + act(y + bias) for ``g``'s dtype and
    layout, vectorized (:func:`epilogue_vec`) where y and the residual are aligned for it.
    Launched through the CUDA seam: any arrays with a device pointer (CuPy, torch), the CPU
    emulator's too."""

    def __init__(self, rt: Any, g: ConvGeom):
        self.rt, self.g, self.vec = rt, g, epilogue_vec(g)
        self.total = g.n * g.k * g.p * g.q
        self.step = self.vec * np_dtype(g.dtype).itemsize  # bytes per vector access
        # the scalar arguments, fixed per problem: made once, not on every call
        self.tail = (np.int64(self.total), *_cuda.i32(g.k, g.p * g.q),
                     *_cuda.epilogue_codes(g))
        self.launches: dict[int, Any] = {}
        self.launch(self.vec)

    def launch(self, vec: int) -> Any:
        if vec not in self.launches:
            g = self.g
            fn = self.rt.function("conv2d/epilogue.cu",
                                  {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype],
                                   "NHWC": int(g.nhwc), "VEC": vec}, "conv_epilogue_inplace")
            self.launches[vec] = cuda.Launch(
                fn, _cuda.grid1d(self.total // vec, 256, 65535 * 8), (256, 1, 1))
        return self.launches[vec]

    def __call__(self, y: Any, inputs: Mapping[str, Any]) -> None:
        """y = residual + act(y + bias), in place over all of y (after a library's GEMM /
        convolution)."""
        g = self.g
        bias, res = _cuda.epilogue_ptrs(g, y, inputs)
        vec, step = self.vec, self.step
        if vec > 1 and (cuda.ptr(y) % step or (g.residual and cuda.ptr(res) % step)):
            vec = 1  # a view at an odd offset: scalar accesses
        self.launch(vec)((y, bias, res, *self.tail))


def epilogue_kernel(run: Any, g: ConvGeom, tail: tuple[Any, ...]) -> Any:
    """The kernel of a launch ``run(x, w, y, bias, residual, *tail)`` with the epilogue
    fused (absent bias / residual passed as y, see _cuda.epilogue_ptrs)."""

    def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
               attrs: Mapping[str, Any]) -> None:
        y = outputs["y"]
        bias, res = _cuda.epilogue_ptrs(g, y, inputs)
        run((inputs["x"], inputs["w"], y, bias, res, *tail))

    # one launch object (no copy, no library call): the dispatcher may replay it from C++
    kernel.replayable = isinstance(run, cuda.Launch)  # type: ignore[attr-defined]
    return kernel


def io_dtype(g: ConvGeom) -> np.dtype:
    return np_dtype(g.dtype)
