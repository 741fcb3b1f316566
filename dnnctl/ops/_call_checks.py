"""Call-side validation of ``dnnctl.ops.*`` arguments, in one place.

Every bad argument becomes a :class:`~dnnctl.errors.ShapeError` / ``UsageError`` that names
the argument and says how to fix it: missing or non-array arguments, NumPy masked arrays and
matrices (refused: kernels read the raw data and would ignore the mask), dtypes the kernels
do not have, non-contiguous inputs, read-only or mis-shaped outputs, non-numeric scalars,
axes out of range, a ``plan=`` that is not a loaded plan, and outputs larger than the free
memory of the device (checked before allocating, once per call signature).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import DTYPES, dtype_name

_DTYPE_NAMES: dict[Any, str] = {}


def check_array_kind(a: Any, what: str) -> None:
    """Refuse array types whose data the kernels would misread (masked arrays, matrices)."""
    if isinstance(a, np.ma.MaskedArray):
        raise ShapeError(f"{what} is a NumPy masked array; dnnctl kernels read the raw data "
                         "and would ignore its mask",
                         hint=f"fill the masked values first, e.g. {what}.filled(-np.inf) for "
                              f"softmax or {what}.filled(0), or pass np.asarray({what})")
    if isinstance(a, np.matrix):
        raise ShapeError(f"{what} is a numpy.matrix", hint=f"pass np.asarray({what})")


def array_name(names: Sequence[str] | None, index: int) -> str:
    if names is not None and index < len(names):
        return names[index]
    return f"argument {index + 1}"


def require(op: str, names: Sequence[str], arrays: Sequence[Any]) -> None:
    """A ShapeError naming the first of ``names`` whose array (in the same order) is None."""
    for name, a in zip(names, arrays):
        if a is None:
            raise ShapeError(f"{op}: {name} is required, got None",
                             hint=f"pass an array as {name}")


def float_dtype(x: Any, what: str) -> str:
    """dnnctl dtype name of ``x`` (float32 / float16 / bfloat16) or a ShapeError."""
    if x is None:
        raise ShapeError(f"{what} is required, got None", hint=f"pass an array as {what}")
    dt = x.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:  # str(dtype) costs microseconds: once per dtype object
        name = _DTYPE_NAMES[dt] = dtype_name(dt)
    if name not in DTYPES:
        raise ShapeError(f"{what} has dtype {name}, expected one of {', '.join(DTYPES)}",
                         hint=f"cast it first, e.g. {what}.astype('float32')")
    return name


def contiguous(x: Any, what: str) -> Any:
    """``x`` if it is C-contiguous; otherwise a ShapeError (kernels index flat memory)."""
    if not x.flags.c_contiguous:
        raise ShapeError(f"{what} must be C-contiguous (shape {tuple(x.shape)}, strides "
                         f"{tuple(x.strides)})",
                         hint="pass x.copy() / ascontiguousarray(x) / tensor.contiguous()")
    return x


def writeable(a: Any, what: str) -> None:
    """Outputs (``out=``, in-place inputs) must be writeable."""
    flags = getattr(a, "flags", None)
    if flags is not None and getattr(flags, "writeable", True) is False:
        raise ShapeError(f"{what} is read-only, so the result cannot be written into it",
                         hint=f"pass a writeable array (e.g. {what}.copy()) or leave it unset")


def check_vector(v: Any, length: int, dtype: str, what: str) -> None:
    """A parameter vector must be contiguous, 1-D of ``length`` and of ``dtype``."""
    if v is None:
        return
    if tuple(v.shape) != (length,):
        raise ShapeError(f"{what} has shape {tuple(v.shape)}, expected ({length},)")
    got = dtype_name(v.dtype)
    if got != dtype:
        raise ShapeError(f"{what} has dtype {got}, expected {dtype}",
                         hint=f"cast it: {what}.astype('{dtype}')")
    contiguous(v, what)


def check_stats(v: Any, count: int, what: str) -> bool:
    """A gradient call's saved statistic (mean, rstd, ...) must hold ``count`` values, else a
    ShapeError; returns whether kernels can read it by pointer as it is (fp32, C-contiguous)
    rather than from an fp32 contiguous copy."""
    if v.size != count:
        raise ShapeError(f"{what} has {v.size} values, expected {count}")
    return bool(v.flags.c_contiguous) and dtype_name(v.dtype) == "float32"


def check_like(a: Any, shape: tuple[int, ...], dtype: str, what: str) -> None:
    """An array that must have ``shape`` and ``dtype`` and be contiguous (None passes)."""
    if a is None:
        return
    if tuple(a.shape) != tuple(shape):
        raise ShapeError(f"{what} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    got = dtype_name(a.dtype)
    if got != dtype:
        raise ShapeError(f"{what} has dtype {got}, expected {dtype}")
    contiguous(a, what)


def check_out(out: Any, shape: tuple[int, ...], dtype: str, what: str = "out") -> None:
    """``out=`` must have the result's shape and dtype, be contiguous and writeable."""
    if out is None:
        return
    check_like(out, shape, dtype, what)
    writeable(out, what)


def check_layout(layout: Any) -> str:
    text = str(layout).upper()
    if text not in ("NCHW", "NHWC"):
        raise ShapeError(f"layout {layout!r} is not supported, expected 'NCHW' or 'NHWC'")
    return text


def as_float(value: Any, what: str, *, minimum: float | None = None) -> float:
    """A finite real scalar argument (eps, momentum, negative_slope, ...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"{what}={value!r} must be a number, not {type(value).__name__}",
                         hint=f"e.g. {what}=1e-5")
    out = float(value)
    if not math.isfinite(out) or (minimum is not None and out < minimum):
        raise UsageError(f"{what}={value!r} must be a finite number"
                         + (f" >= {minimum:g}" if minimum is not None else ""))
    return out


def axis_index(axis: Any, rank: int, what: str = "axis") -> int:
    """A Python int axis in [-rank, rank), as a non-negative index."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise UsageError(f"{what}={axis!r} must be an int, not {type(axis).__name__}",
                         hint=f"e.g. {what}=-1 for the last axis")
    if not -rank <= int(axis) < rank:
        raise ShapeError(f"{what} {axis} is out of range for x of rank {rank}",
                         hint=f"use {-rank} .. {rank - 1}")
    return int(axis) % rank


def check_plan(plan: Any) -> None:
    """``plan=`` must be a loaded plan (or None); a path is a common slip."""
    if plan is None or callable(getattr(plan, "lookup", None)):
        return
    if isinstance(plan, (str, os.PathLike)):
        raise UsageError(f"plan={os.fspath(plan)!r} is a path, not a loaded plan",
                         hint=f"load it once: plan = dnnctl.load_plan({os.fspath(plan)!r})")
    raise UsageError(f"plan must be a plan from dnnctl.load_plan(), not "
                     f"{type(plan).__name__}", hint="pass plan=dnnctl.load_plan(path) or None")


def free_bytes(backend: Any, device: Any) -> int | None:
    """Memory that new arrays of ``backend`` on ``device`` can use now (None: unknown)."""
    if getattr(backend, "name", "") == "cupy":
        try:
            import cupy

            free, _ = cupy.cuda.runtime.memGetInfo()
            return int(free) + int(cupy.get_default_memory_pool().free_bytes())
        except Exception:  # noqa: BLE001 - unknown: no check
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(op: str, outputs: Sequence[tuple[str, tuple[int, ...], Any]], backend: Any,
               device: Any) -> None:
    """Refuse a call whose outputs cannot fit in free memory, before allocating them."""
    need = sum(math.prod(shape) * np.dtype(dt).itemsize for _, shape, dt in outputs)
    if need < (64 << 20):  # small outputs: not worth asking the device
        return
    free = free_bytes(backend, device)
    if free is not None and need > free:
        shapes = ", ".join(f"{n} {tuple(s)}" for n, s, _ in outputs)
        raise ShapeError(f"{op}: the result needs {need / 2**30:.1f} GiB ({shapes}) but only "
                         f"{free / 2**30:.1f} GiB is free on {getattr(device, 'name', 'the device')}",
                         hint="split the call into smaller batches, or free memory first")
