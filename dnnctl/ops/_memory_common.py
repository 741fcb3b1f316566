"""Plumbing shared by the memory-bound ops (activation, softmax, norms, pooling).

CUDA side: dtype codes for ``-DDNNCTL_DTYPE``, module compilation through the cupy backend
(memoized there), launch objects that hold their function handle and launch configuration
(computed once at build time, so a call is one argument tuple and one launch), and pointer
alignment checks for the 16-byte vector paths.

Call side: validation of the arrays handed to ``dnnctl.ops.*`` lives in
:mod:`dnnctl.ops._call_checks` (re-exported here for the ops' ``mc.*`` calls).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from dnnctl.ops._call_checks import (  # noqa: F401 - the ops use them as mc.*
    as_float,
    axis_index,
    check_layout,
    check_out,
    check_vector,
    contiguous,
    float_dtype,
    writeable,
)
from dnnctl.ops.base import dtype_size

DTYPE_CODE: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2}
VECS: tuple[int, ...] = (1, 2, 4, 8)  # elements per vector access; bytes <= 16 (see vec_fits)


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
    from dnnctl.backends.base import get_backend

    return get_backend("cupy").compile_module(
        source, defines=defines, name_expressions=tuple(dict.fromkeys(names)),
        device=getattr(device, "index", None))


class Launch:
    """One kernel launch with its configuration fixed at build time.

    With CuPy a call goes straight to the CUDA function loaded for the build's device (not
    through RawKernel's per-call device lookup and keyword handling), and scalar arguments
    made by :meth:`consts` / :meth:`f32` are converted to C values once, not per launch.
    On another current device it falls back to the RawKernel, which loads it there.
    """

    __slots__ = ("fn", "grid", "block", "smem", "cuda", "device", "getdev", "cscalar", "memo")

    def __init__(self, fn: Any, grid: tuple[int, ...], block: tuple[int, ...],
                 smem: int = 0) -> None:
        self.fn, self.grid, self.block, self.smem = fn, grid, block, int(smem)
        self.cuda, self.device, self.getdev, self.cscalar = _cuda_function(fn)
        self.memo: dict[Any, Any] = {}

    def __call__(self, args: tuple[Any, ...]) -> None:
        cuda = self.cuda
        if cuda is not None and self.getdev() == self.device:
            cuda(self.grid, self.block, args, self.smem)
        else:
            self.fn(self.grid, self.block, args, shared_mem=self.smem)

    def consts(self, *values: Any) -> tuple[Any, ...]:
        """Scalar arguments fixed at build time (NumPy scalars), in launch-ready form."""
        conv = self.cscalar
        if conv is None:
            return values
        return tuple(conv(v) if isinstance(v, np.generic) else v for v in values)

    def f32(self, value: Any) -> Any:
        """A float32 argument given per call (eps, slope, momentum), converted once per
        value (equal values are the same float32; zeros are not kept: -0.0 == 0.0)."""
        arg = self.memo.get(value) if value else None
        if arg is None:
            arg = self.consts(np.float32(value))[0]
            if value and len(self.memo) < 16:
                self.memo[value] = arg
        return arg


def _cuda_function(fn: Any) -> tuple[Any, int, Any, Any]:
    """(CUDA function, its device, cupy getDevice, CScalar) behind a CuPy RawKernel; Nones
    for anything else (the CPU emulator, test recorders), which are called as given."""
    if not type(fn).__module__.startswith("cupy"):
        return None, -1, None, None
    try:
        import cupy
        from cupy.cuda.function import Function

        cuda = fn.kernel  # loads the module on the current device (the build's)
        if not isinstance(cuda, Function):
            return None, -1, None, None
        getdev = cupy.cuda.runtime.getDevice
        return cuda, getdev(), getdev, _cscalar()
    except Exception:  # noqa: BLE001 - another CuPy layout: the RawKernel call still works
        return None, -1, None, None


@functools.cache
def _cscalar() -> Any:
    """CuPy's C scalar wrapper (what it makes of a NumPy scalar argument on every launch),
    or None where this CuPy lacks it (arguments then stay NumPy scalars)."""
    try:
        from cupy._core._scalar import CScalar

        probe = CScalar(np.int32(7))
        if int(probe.ptr) == 0:
            return None
    except Exception:  # noqa: BLE001
        return None
    return CScalar


def launch(module: Any, name: str, grid: int | Sequence[int], block: int | Sequence[int],
           smem: int = 0) -> Launch:
    """A :class:`Launch` of ``name`` in ``module``; opts into > 48 KiB of shared memory."""
    fn = module.get_function(name)
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    grid_t = (int(grid),) if isinstance(grid, int) else tuple(int(g) for g in grid)
    block_t = (int(block),) if isinstance(block, int) else tuple(int(b) for b in block)
    return Launch(fn, grid_t, block_t, int(smem))


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
    """Launch arguments with converted scalars turned back into their NumPy scalars."""
    conv = _cscalar() if "cupy" in sys.modules else None
    if conv is None:
        return tuple(args)
    return tuple(a.value if isinstance(a, conv) else a for a in args)


def aligned(nbytes: int, *arrays: Any) -> bool:
    """Every array's data pointer is a multiple of ``nbytes`` (None entries are skipped)."""
    for a in arrays:
        if a is not None:
            ptr = a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr
            if ptr % nbytes:  # (NumPy arrays: the CPU emulator standing in for CuPy)
                return False
    return True


def workspace(device: Any, nbytes: int) -> Any:
    """A float32 scratch buffer of at least ``nbytes`` on ``device`` for the cupy backend."""
    from dnnctl.backends.base import get_backend

    xp = get_backend("cupy").xp
    size = max(1, cdiv(nbytes, 4))
    if xp is np:  # the CPU emulator stands in for CuPy
        return np.empty(size, dtype=np.float32)
    with xp.cuda.Device(getattr(device, "index", 0)):
        return xp.empty(size, dtype=np.float32)


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


def data_ptr(a: Any) -> int:
    if isinstance(a, np.ndarray):
        return int(a.__array_interface__["data"][0])
    return int(a.data.ptr)


def same_memory(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same tensor memory (start pointer and shape)."""
    return a is b or (data_ptr(a) == data_ptr(b) and tuple(a.shape) == tuple(b.shape))
