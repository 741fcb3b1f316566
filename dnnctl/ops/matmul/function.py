"""The public ``dnnctl.ops.matmul`` call: operands -> problem key -> planned variant -> launch."""

from __future__ import annotations

import contextlib
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops._memory_common import data_ptr
from dnnctl.ops.base import dtype_name
from dnnctl.ops.dispatch import PlanLike, Prepared, SiteCache, bind, run, signature
from dnnctl.ops.matmul.op import ACTIVATIONS


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype(x: Any) -> str:
    """dnnctl dtype name of an array, memoized per dtype object (str(dtype) costs ~5 us)."""
    dt = x.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dtype_name(dt)
    return name


def _stored(x: Any, xp: Any) -> tuple[Any, bool]:
    """(array laid out row-major, transposed?) for a logical (..., rows, cols) operand.

    A C-contiguous array is used as is; a transposed view of one (numpy ``a.T``, torch
    ``a.mT``) is passed as its contiguous storage with the key's trans flag set, so no copy
    is made; anything else is copied to C order.
    """
    if x.flags.c_contiguous:
        return x, False
    swapped = xp.swapaxes(x, -1, -2)
    if swapped.flags.c_contiguous:
        return swapped, True
    return xp.ascontiguousarray(x), False


def matmul(a: Any, b: Any, bias: Any = None, activation: str | None = None,
           tf32: bool = False, plan: PlanLike | None = None) -> Any:
    """``act(a @ b + bias)`` with fp32 accumulation; 2-D or batched 3-D operands.

    ``a`` is (m, k) or (batch, m, k), ``b`` (k, n) or (batch, k, n) (a 2-D operand is shared
    by every batch), ``bias`` (n,). Transposed views are read in place (the key's
    trans_a / trans_b). NumPy arrays run on the numpy backend, CuPy arrays and DLPack CUDA
    tensors (torch, zero-copy) on the GPU; the result is of the input's kind. ``tf32`` lets
    float32 products use TF32 tensor cores. The variant is the plan's choice for this shape
    (``plan`` or the active one), else the default heuristic.
    """
    try:  # a signature seen before: no validation, no views but transposes
        prep, swap_a, swap_b = _FAST[(signature(a), signature(b), signature(bias), activation,
                                      tf32)]
    except (AttributeError, KeyError, TypeError):
        pass
    else:
        ins = {"a": _swapped(a) if swap_a else a, "b": _swapped(b) if swap_b else b}
        if bias is not None:
            ins["bias"] = bias
        return prep.run(ins, plan)["y"]
    act = "none" if activation is None else str(activation)
    if act not in ACTIVATIONS:
        raise UsageError(f"matmul: activation={activation!r} is not supported",
                         hint="use None, 'relu', 'gelu' or 'silu'")
    bound = bind(a, b, bias)
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        xa, xb, xbias = bound.arrays
        return bound.wrap(matmul(xa, xb, xbias, activation, tf32, plan))
    xp = bound.backend.xp
    xa, xb, xbias = bound.arrays
    if len(xa.shape) not in (2, 3) or len(xb.shape) not in (2, 3):
        raise ShapeError(f"matmul: a {_shape(xa)} and b {_shape(xb)} must be 2-D or 3-D",
                         hint="a is (m, k) or (batch, m, k); b is (k, n) or (batch, k, n)")
    m, k = _shape(xa)[-2:]
    k2, n = _shape(xb)[-2:]
    if k != k2:
        raise ShapeError(f"matmul: a {_shape(xa)} and b {_shape(xb)} do not chain "
                         f"(k = {k} vs {k2})", hint="a's last dim must equal b's second-last")
    dtype = _dtype(xa)
    for name, arr in (("b", xb), ("bias", xbias)):
        if arr is not None and _dtype(arr) != dtype:
            raise ShapeError(f"matmul: {name} has dtype {_dtype(arr)}, expected "
                             f"{dtype} (the dtype of a)", hint="cast every input to one dtype")
    if xbias is not None:
        if _shape(xbias) != (n,):
            raise ShapeError(f"matmul: bias has shape {_shape(xbias)}, expected ({n},)")
        if not xbias.flags.c_contiguous:
            xbias = xp.ascontiguousarray(xbias)
    batch_a = _shape(xa)[0] if len(xa.shape) == 3 else None
    batch_b = _shape(xb)[0] if len(xb.shape) == 3 else None
    out_3d = batch_a is not None or batch_b is not None
    if None not in (batch_a, batch_b) and batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ShapeError(f"matmul: batch sizes {batch_a} and {batch_b} differ",
                             hint="give equal batch sizes, or 1 / a 2-D operand to broadcast")
    batch = max(batch_a or 1, batch_b or 1)

    if batch_b in (None, 1) and batch > 1 and xa.flags.c_contiguous:
        # (batch, m, k) @ (k, n): one product of batch*m rows
        sa, ta = xa.reshape(batch * m, k), False
        sb, tb = _stored(xb.reshape(k, n), xp)
        rows, batch_key = batch * m, 1
    else:
        rows, batch_key = m, batch
        if batch > 1:
            xa = xp.broadcast_to(xa.reshape((-1, m, k)), (batch, m, k))
            xb = xp.broadcast_to(xb.reshape((-1, k, n)), (batch, k, n))
        else:  # (views are not free: only reshape 3-D operands of batch 1)
            xa = xa if len(xa.shape) == 2 else xa.reshape(m, k)
            xb = xb if len(xb.shape) == 2 else xb.reshape(k, n)
        sa, ta = _stored(xa, xp)
        sb, tb = _stored(xb, xp)
    key = {"batch": batch_key, "m": rows, "n": n, "k": k, "dtype": dtype, "trans_a": ta,
           "trans_b": tb, "bias": xbias is not None, "activation": act, "tf32": bool(tf32)}
    fa, fb = _swapped(a) if ta else a, _swapped(b) if tb else b
    if _same_storage(fa, sa) and _same_storage(fb, sb) and xbias is bias:
        # what a repeated call passes (the caller's arrays, transposes as views) is this
        # call's operands byte for byte: remember the signature
        prep = Prepared("matmul", key, bound, {}, {
            "a": tuple(fa.shape), "b": tuple(fb.shape),
            "y": (batch, m, n) if out_3d else (m, n)})
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put((signature(a), signature(b), signature(bias), activation, tf32),
                      (prep, ta, tb))
        ins = {"a": fa, "b": fb}
        if bias is not None:
            ins["bias"] = bias
        return prep.run(ins, plan)["y"]
    bound.arrays = [sa, sb, xbias]
    y = run("matmul", key, bound, ("a", "b", "bias"), {}, plan=plan)["y"]
    if out_3d:
        y = y.reshape(batch, m, n)
    return bound.wrap(y)


_FAST = SiteCache()


def _swapped(x: Any) -> Any:
    """The row-major storage of a transposed operand (a view)."""
    return x.swapaxes(-1, -2)


def _same_storage(x: Any, stored: Any) -> bool:
    """Both C-contiguous over the same memory (so equal for pointer-reading kernels)."""
    return (x.flags.c_contiguous and stored.flags.c_contiguous and x.size == stored.size
            and data_ptr(x) == data_ptr(stored))
