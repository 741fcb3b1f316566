"""The public ``dnnctl.ops.matmul`` call: operands -> problem key -> planned variant -> launch."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops._memory_common import data_ptr
from dnnctl.ops.base import dtype_name
from dnnctl.ops.dispatch import CallSpec, Parsed, PlanLike, call
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


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    a, b, bias = arrays
    activation, tf32 = scalars
    act = "none" if activation is None else str(activation)
    if act not in ACTIVATIONS:
        raise UsageError(f"matmul: activation={activation!r} is not supported",
                         hint="use None, 'relu', 'gelu' or 'silu'")
    if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
        raise ShapeError(f"matmul: a {_shape(a)} and b {_shape(b)} must be 2-D or 3-D",
                         hint="a is (m, k) or (batch, m, k); b is (k, n) or (batch, k, n)")
    m, k = _shape(a)[-2:]
    k2, n = _shape(b)[-2:]
    if k != k2:
        raise ShapeError(f"matmul: a {_shape(a)} and b {_shape(b)} do not chain "
                         f"(k = {k} vs {k2})", hint="a's last dim must equal b's second-last")
    if 0 in (m, n, k):
        raise ShapeError(f"matmul: a {_shape(a)} and b {_shape(b)} have a zero-size dimension")
    dtype = _dtype(a)
    for name, arr in (("b", b), ("bias", bias)):
        if arr is not None and _dtype(arr) != dtype:
            raise ShapeError(f"matmul: {name} has dtype {_dtype(arr)}, expected "
                             f"{dtype} (the dtype of a)", hint="cast every input to one dtype")
    if bias is not None and _shape(bias) != (n,):
        raise ShapeError(f"matmul: bias has shape {_shape(bias)}, expected ({n},)")
    batch_a = _shape(a)[0] if len(a.shape) == 3 else None
    batch_b = _shape(b)[0] if len(b.shape) == 3 else None
    out_3d = batch_a is not None or batch_b is not None
    if None not in (batch_a, batch_b) and batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ShapeError(f"matmul: batch sizes {batch_a} and {batch_b} differ",
                         hint="give equal batch sizes, or 1 / a 2-D operand to broadcast")
    batch = max(batch_a or 1, batch_b or 1)
    fold = batch_b in (None, 1) and batch > 1 and a.flags.c_contiguous

    def stored(xa: Any, xb: Any) -> tuple[Any, bool, Any, bool]:
        """The operands as the kernels read them (row-major storage + trans flags)."""
        if fold:  # (batch, m, k) @ (k, n): one product of batch*m rows
            sb, tb = _stored(xb.reshape(k, n), xp)
            return xa.reshape(batch * m, k), False, sb, tb
        if batch > 1:
            xa = xp.broadcast_to(xa.reshape((-1, m, k)), (batch, m, k))
            xb = xp.broadcast_to(xb.reshape((-1, k, n)), (batch, k, n))
        else:  # (views are not free: only reshape 3-D operands of batch 1)
            xa = xa if len(xa.shape) == 2 else xa.reshape(m, k)
            xb = xb if len(xb.shape) == 2 else xb.reshape(k, n)
        sa, ta = _stored(xa, xp)
        sb, tb = _stored(xb, xp)
        return sa, ta, sb, tb

    sa, ta, sb, tb = stored(a, b)
    rows, batch_key = (batch * m, 1) if fold else (m, batch)
    key = {"batch": batch_key, "m": rows, "n": n, "k": k, "dtype": dtype, "trans_a": ta,
           "trans_b": tb, "bias": bias is not None, "activation": act, "tf32": bool(tf32)}
    y_shape = (batch, m, n) if out_3d else (m, n)
    spec = {"a": tuple(sa.shape), "b": tuple(sb.shape), "y": (batch_key, rows, n)}
    fa, fb = _swapped(a) if ta else a, _swapped(b) if tb else b
    bias_ok = bias is None or bias.flags.c_contiguous
    if _same_storage(fa, sa) and _same_storage(fb, sb) and bias_ok:
        # the caller's arrays (transposes as views) are the operands byte for byte
        inputs = (("a", 0, _swapped if ta else None), ("b", 1, _swapped if tb else None),
                  ("bias", 2, None))
        return Parsed("matmul", key, inputs, (("y", y_shape, a.dtype),), kernel_shapes=spec)

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        pa, _, pb, _ = stored(back[0], back[1])
        ins = {"a": xp.ascontiguousarray(pa).reshape(spec["a"]),
               "b": xp.ascontiguousarray(pb).reshape(spec["b"])}
        if back[2] is not None:
            ins["bias"] = xp.ascontiguousarray(back[2])
        return ins

    return Parsed("matmul", key, (), (("y", y_shape, a.dtype),), kernel_shapes=spec,
                  prepare=prepare)


_MATMUL = CallSpec("matmul", _parse, ("a", "b"))


def matmul(a: Any, b: Any, bias: Any = None, activation: str | None = None,
           tf32: bool = False, plan: PlanLike | None = None) -> Any:
    """``act(a @ b + bias)`` with fp32 accumulation; 2-D or batched 3-D operands.

    ``a`` is (m, k) or (batch, m, k), ``b`` (k, n) or (batch, k, n) (a 2-D operand is shared
    by every batch), ``bias`` (n,). Transposed views are read in place (the key's
    trans_a / trans_b). NumPy arrays run on the numpy backend, CuPy arrays and torch CUDA
    tensors on the GPU (torch by pointer, on torch's current stream); the result is of the
    input's kind. ``tf32`` lets float32 products use TF32 tensor cores. The variant is the
    plan's choice for this shape (``plan`` or the active one), else the default heuristic.
    """
    return call(_MATMUL, (a, b, bias), (activation, bool(tf32)), plan)


def _swapped(x: Any) -> Any:
    """The row-major storage of a transposed operand (a view)."""
    return x.swapaxes(-1, -2)


def _same_storage(x: Any, stored: Any) -> bool:
    """Both C-contiguous over the same memory (so equal for pointer-reading kernels)."""
    return (x.flags.c_contiguous and stored.flags.c_contiguous and x.size == stored.size
            and data_ptr(x) == data_ptr(stored))
