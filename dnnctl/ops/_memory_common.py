"""Plumbing shared by the memory-bound ops (activation, softmax, norms, pooling).

CUDA side: dtype codes for ``-DDNNCTL_DTYPE``, module compilation through the cupy backend
(memoized there), launch objects that hold their function handle and launch configuration
(computed once at build time, so a call is one argument tuple and one launch), and pointer
alignment checks for the 16-byte vector paths; the bases the ops' CUDA variants share:
:class:`CudaVariant` (a build of two launch programs, the vector one and its scalar fallback)
and :class:`VecKernel` (the built kernel picking between them by alignment). :class:`MemoryOp`
gives the family's one forward tolerance.

Call side: validation of the arrays handed to ``dnnctl.ops.*`` lives in
:mod:`dnnctl.ops._call_checks` (re-exported here for the ops' ``mc.*`` calls).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.cuda import Launch, launch, ptr
from dnnctl.errors import ShapeError
from dnnctl.ops import codes
from dnnctl.ops._call_checks import (  # noqa: F401 - the ops use them as mc.*
    as_float,
    axis_index,
    check_layout,
    check_like,
    check_out,
    check_stats,
    check_vector,
    contiguous,
    float_dtype,
    writeable,
)
from dnnctl.ops.base import SUPPORTED, Op, Problem, Support, Variant, dtype_size

__all__ = ["Launch", "launch", "ptr"]  # the launch objects live in the CUDA seam

DTYPE_CODE: dict[str, int] = codes.DTYPE
VECS: tuple[int, ...] = (1, 2, 4, 8)  # elements per vector access; bytes <= 16 (see vec_fits)
# the forward tolerance of the memory-bound ops (fp32 arithmetic, one rounding to the dtype)
FORWARD_TOL: dict[str, float] = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vec_fits(dtype: str, vec: int) -> bool:
    """A vector of ``vec`` elements is at most one 16-byte access."""
    return vec * dtype_size(dtype) <= 16


def max_vec(dtype: str) -> int:
    return 16 // dtype_size(dtype)


def sm_count(device: Any) -> int:
    return int(getattr(device, "sm_count", 0) or 132)


def smem_limit(device: Any) -> int:
    """Dynamic shared memory one block may opt into (bytes)."""
    return int(getattr(device, "smem_per_block_optin", 0) or 48 * 1024)


def index_type(n: int) -> str:
    """C index type of a kernel walking ``n`` elements: 32-bit while sums cannot overflow."""
    return "unsigned int" if n < (1 << 30) else "long long"


def index_scalar(n: int, itype: str) -> Any:
    return np.uint32(n) if itype == "unsigned int" else np.int64(n)


def channel_geometry(problem: Any) -> tuple[int, int, int]:
    """(elements, inner, channels) of an activation-shaped problem (key fields shape, bias,
    layout): the channel of flat index e is (e // inner) % channels."""
    shape = problem["shape"]
    n = math.prod(shape)
    if problem["bias"] == "none":
        return n, 1, 1
    if problem["layout"] == "NCHW":
        return n, math.prod(shape[2:]), shape[1]
    return n, 1, shape[-1]


def memo_per_problem(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Memoize an Op method on its arguments (problem, and backend / device for heuristics):
    the dispatcher asks for default_choice and output_specs on every unplanned call."""
    cache: dict[tuple, Any] = {}

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any) -> Any:
        try:
            return cache[args]
        except KeyError:
            out = cache[args] = fn(self, *args)
            return out
        except TypeError:  # an unhashable device description: no memo
            return fn(self, *args)

    return wrapper


# ----------------------------------------------------------------------------- CUDA


def compile_cuda(source: str, defines: dict[str, Any], names: Iterable[str], device: Any) -> Any:
    """Compile ``kernels/<source>`` with every template instance in ``names`` (memoized)."""
    from dnnctl.backends.registry import get_backend

    return get_backend("cupy").compile_module(
        source, defines=defines, name_expressions=tuple(dict.fromkeys(names)),
        device=getattr(device, "index", None))


@contextlib.contextmanager
def traced_launches() -> Iterator[list[tuple[Any, ...]]]:
    """Record every :class:`Launch` call in the block as (RawKernel, grid, block, args with
    NumPy scalars, smem): benchmarks replay them as bare CuPy launches."""
    log: list[tuple[Any, ...]] = []
    plain = Launch.__call__

    def traced(self: Launch, args: tuple[Any, ...]) -> None:
        log.append((self.fn, self.grid, self.block, plain_args(args), self.smem))
        plain(self, args)

    Launch.__call__ = traced  # type: ignore[method-assign]
    try:
        yield log
    finally:
        Launch.__call__ = plain  # type: ignore[method-assign]


def plain_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Launch arguments as a bare CuPy launch takes them (they are plain already)."""
    return tuple(args)


def aligned(nbytes: int, *arrays: Any) -> bool:
    """Every array's data pointer is a multiple of ``nbytes`` (None entries are skipped)."""
    for a in arrays:  # noqa: SIM110 - a plain loop is the cheapest on the hot path
        if ptr(a) % nbytes:  # (NumPy arrays: the CPU emulator standing in for CuPy)
            return False
    return True


class MemoryOp(Op):
    """An op of this family: fp32 arithmetic rounded once to the output's dtype, so the one
    forward tolerance :data:`FORWARD_TOL`."""

    def tolerance(self, problem: Problem, output: str) -> float:
        return FORWARD_TOL[problem["dtype"]]


class CudaVariant(Variant):
    """A CUDA variant (cupy backend) that takes every problem of its passes unless its own
    ``supports`` says otherwise. Its default :meth:`build` is two launch programs (see
    :class:`VecKernel`): a subclass gives :meth:`program`, and :meth:`wrap` where the built
    kernel is not a :class:`PairKernel` (x -> y)."""

    backend = "cupy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Any:
        vec = self.planned_vec(problem, params, device)
        return self.wrap(problem, vec, self.program(problem, params, vec, device),
                         self.program(problem, params, 1, device))

    def planned_vec(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        """The vector width of the fast program: ``vec`` where the parameters are valid."""
        return params.get("vec", 1) if self.valid_params(problem, params, device) else 1

    def defines(self, problem: Problem) -> dict[str, Any]:
        """The -D values kernels/<source> is compiled with."""
        raise NotImplementedError

    def compile(self, problem: Problem, params: Mapping[str, Any], device: Any,
                *instances: Callable[[int], str]) -> Any:
        """The module of kernels/<source> holding each template instance (a function of the
        vector width) at the planned width and at 1: both programs' kernels."""
        widths = dict.fromkeys((self.planned_vec(problem, params, device), 1))
        return compile_cuda(self.source, self.defines(problem),
                            [f(v) for f in instances for v in widths], device)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        """The launches of one call at vector width ``vec``, as a callable."""
        raise NotImplementedError

    def wrap(self, problem: Problem, vec: int, fast: Any, safe: Any) -> Any:
        """The built kernel of the ``vec``-wide and the scalar program."""
        return PairKernel(fast, safe, vec * dtype_size(problem["dtype"]))


class CudaBackward(CudaVariant):
    """A CUDA variant of the backward pass."""

    passes = ("backward",)


def stream_launch(mod: Any, name: str, nvec: int, block: int, device: Any) -> Launch:
    """A grid-stride stream over ``nvec`` vectors: two waves of full occupancy (2048 threads
    per SM), fewer blocks for a short stream."""
    return launch(mod, name, max(1, min(cdiv(nvec, block), sm_count(device) * (2048 // block)
                                         * 2)), block)


class VecKernel:
    """A built kernel of two programs: ``fast``, at the planned vector width, when the arrays
    a call checks are aligned to ``align`` bytes, else ``safe`` (one element per access).
    Subclasses' ``__call__`` pick the arrays and pass them on, with ``consts`` where the
    programs are launches taking trailing constants (converted once, here)."""

    __slots__ = ("fast", "safe", "align", "consts")
    flat_io = True  # reads only data pointers: any contiguous arrays of the problem's sizes
    # a call only launches kernels (cuda.Launch) into the call's arrays, its kept workspace
    # and per-call scratch: the dispatcher may record it once and replay it from C++
    # (dnnctl.backends.replay; a recording that is anything else is refused there)
    replayable = True

    def __init__(self, fast: Any, safe: Any, align: int, consts: tuple = ()) -> None:
        self.fast, self.safe, self.align = fast, safe, align
        self.consts = fast.consts(*consts) if consts else ()


class PairKernel(VecKernel):
    """One input array to one output array (``x`` -> ``y``, or ``dy`` -> ``dx``): a program
    takes the two."""

    __slots__ = ("src", "dst")

    def __init__(self, fast: Any, safe: Any, align: int, src: str = "x",
                 dst: str = "y") -> None:
        super().__init__(fast, safe, align)
        self.src, self.dst = src, dst

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        a, b = inputs[self.src], outputs[self.dst]
        (self.fast if aligned(self.align, a, b) else self.safe)(a, b)


def workspace(device: Any, nbytes: int) -> Any:
    """A float32 scratch buffer of at least ``nbytes`` on ``device`` for the cupy backend."""
    from dnnctl.backends.registry import get_backend

    xp = get_backend("cupy").xp
    size = max(1, cdiv(nbytes, 4))
    if xp is np:  # the CPU emulator stands in for CuPy
        return np.empty(size, dtype=np.float32)
    # the kernel keeps it for good: from CuPy's pool whatever allocator the call in flight
    # has made current (a torch caller's, see adapters.enter_all)
    return cuda.kept(4 * size, getattr(device, "index", 0)).view(np.float32)


# ----------------------------------------------------------------------------- numpy


def f32(a: np.ndarray) -> np.ndarray:
    """A float32 copy / view of ``a`` for the CPU variants (which compute in fp32)."""
    return a.astype(np.float32, copy=False)


def put(dst: np.ndarray, value: np.ndarray) -> None:
    """Write ``value`` into ``dst`` rounding once to ``dst``'s dtype."""
    np.copyto(dst, value, casting="unsafe")


_ERFCX_H = 1.0 / 128.0
_ERFCX_TOP = 40.0


@lru_cache(maxsize=1)
def _erfcx_table() -> tuple[np.ndarray, np.ndarray]:
    """erfcx(z) = exp(z^2) erfc(z) and its derivative on [0, 40] (math.erfc, 5121 points)."""
    zs = np.arange(0.0, _ERFCX_TOP + 2 * _ERFCX_H, _ERFCX_H)
    vals = np.array([math.erfc(z) * math.exp(z * z) if z < 26 else _erfcx_asym(z)
                     for z in zs])
    return vals, 2.0 * zs * vals - 2.0 / math.sqrt(math.pi)


def _erfcx_asym(z: float) -> float:
    """Asymptotic series of erfcx (z >= 26: relative error < 1e-13)."""
    t = 1.0 / (2.0 * z * z)
    return (1.0 - t + 3 * t * t - 15 * t ** 3 + 105 * t ** 4) / (z * math.sqrt(math.pi))


def erfc(x: np.ndarray) -> np.ndarray:
    """erfc in float64 with small *relative* error everywhere (numpy has no erf / erfc).

    For x >= 0 it is erfcx(x) * exp(-x^2), erfcx from a cubic Hermite interpolation of
    math.erfc (exact derivative, relative error < 2e-10); for x < 0, 2 - erfc(-x). NaN
    propagates, erfc(-inf) = 2, erfc(+inf) = 0. Evaluated in cache-sized chunks.
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    flat, res = x.reshape(-1), out.reshape(-1)
    step = 1 << 15
    for i in range(0, flat.size, step):
        res[i:i + step] = _erfc_chunk(flat[i:i + step])
    return out


def _erfc_chunk(x: np.ndarray) -> np.ndarray:
    vals, slopes = _erfcx_table()
    h = _ERFCX_H
    with np.errstate(all="ignore"):
        a = np.abs(x)
        inside = a < _ERFCX_TOP
        t = np.where(inside, a, 0.0) * (1.0 / h)  # NaN -> 0 here, restored below
        i = t.astype(np.int64)
        s = t - i
        s2 = s * s
        s3 = s2 * s
        cx = ((2 * s3 - 3 * s2 + 1) * vals[i] + (s3 - 2 * s2 + s) * h * slopes[i]
              + (-2 * s3 + 3 * s2) * vals[i + 1] + (s3 - s2) * h * slopes[i + 1])
        if not inside.all():
            big = 1.0 / (a * math.sqrt(math.pi)) * (1.0 - 0.5 / (a * a))
            cx = np.where(inside, cx, big)
        y = cx * np.exp(-a * a)
        y = np.where(x < 0, 2.0 - y, y)
        y[np.isnan(x)] = np.nan
    return y


# ----------------------------------------------------------------------------- call side


def nonempty_shape(a: Any, op: str, name: str = "x") -> tuple[int, ...]:
    """The shape of a call's array ``name``: at least one dimension, no zero-size axis."""
    shape = tuple(a.shape)
    if not shape or 0 in shape:
        raise ShapeError(f"{op}: {name} has shape {shape}, expected at least one dimension and "
                         "no zero-size axis")
    return shape


def data_ptr(a: Any) -> int:
    return int(ptr(a))


def same_memory(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same tensor memory (start pointer and shape)."""
    return a is b or (data_ptr(a) == data_ptr(b) and tuple(a.shape) == tuple(b.shape))
