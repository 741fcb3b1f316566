"""``dnnctl.ops.matmul_backward``: the gradients of ``y = act(a @ b + bias)``.

    dy' = dy * act'(pre)            (pre = a @ b + bias, the activation's input)
    da  = dy' @ b^T                 (the matmul problem with trans_b)
    db  = a^T @ dy'                 (the matmul problem with trans_a)
    dbias = sum of dy' over rows

The two products are ordinary ``dnnctl.ops.matmul`` calls on transposed views, so they run
the plan's (or the default) matmul variant for those keys and a tuned workload covers them.
dy' and dbias come from one fused pre-pass: on the GPU one kernel reads dy and pre once,
writes dy' and per-chunk column sums, and a second adds the chunks in a fixed order
(kernels/conv2d/bias_grad.cu: deterministic); on the numpy backend the same in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _call_checks as checks
from dnnctl.ops.base import dtype_name
from dnnctl.ops.dispatch import PlanLike, bind
from dnnctl.ops.matmul.function import matmul
from dnnctl.ops.matmul.op import ACT_CODES, ACTIVATIONS


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def act_grad32(pre: np.ndarray, activation: str) -> np.ndarray:
    """act'(pre) in float32 (relu, gelu in the erf form, silu)."""
    from dnnctl.ops.conv2d.numpy_variants import erf32

    x = pre.astype(np.float32)
    if activation == "relu":
        return (x > 0).astype(np.float32)
    if activation == "gelu":
        cdf = np.float32(0.5) * (np.float32(1.0) + erf32(x * np.float32(1 / math.sqrt(2))))
        return cdf + x * np.float32(1 / math.sqrt(2 * math.pi)) * np.exp(np.float32(-0.5) * x * x)
    if activation == "silu":
        with np.errstate(over="ignore"):
            sg = np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
        return sg * (np.float32(1.0) + x * (np.float32(1.0) - sg))
    return np.ones_like(x)


def _prepass_numpy(dy: np.ndarray, pre: Any, act: str, bias_grad: bool
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    n = dy.shape[-1]
    if act == "none":
        dyp = dy
        g32 = dy.astype(np.float32)
    else:
        g32 = dy.astype(np.float32) * act_grad32(pre, act)
        dyp = g32.astype(dy.dtype)
    dbias = g32.reshape(-1, n).sum(axis=0).astype(dy.dtype) if bias_grad else None
    return dyp, dbias


def _prepass_cuda(dy: Any, pre: Any, act: str, bias_grad: bool, xp: Any
                  ) -> tuple[Any, Any]:
    """dy times act'(pre) (dy itself without an activation) and the bias gradient, on the
    current call's stream, buffers from its allocator (backends.cuda.scratch; else xp)."""
    from dnnctl.ops.conv2d import _cuda

    rt = _cuda.runtime()
    n = int(dy.shape[-1])
    m = int(dy.size) // n
    defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[dtype_name(dy.dtype)],
               "GRAD_ACT": ACT_CODES[act]}
    part = rt.function("conv2d/bias_grad.cu", defines, "grad_colsum_partial")
    per, chunks = _cuda.colsum_split(m, n)
    dyp = dy if act == "none" else cuda.scratch(dy.shape, dy.dtype, xp)
    partial = cuda.scratch((chunks, n), np.float32, xp)
    part((-(-n // 32), chunks, 1), (32, 8, 1),
         (dy, dy if pre is None else pre, dyp, partial, np.int64(m), *_cuda.i32(n, m),
          np.int64(0), np.int64(1), np.int64(n), np.int64(per)))
    dbias = None
    if bias_grad:
        fin = rt.function("conv2d/bias_grad.cu", defines, "grad_colsum_finish")
        dbias = cuda.scratch((n,), dy.dtype, xp)
        fin(_cuda.grid1d(n, 256), (256, 1, 1), (partial, dbias, *_cuda.i32(n, chunks)))
    return dyp, dbias


def matmul_backward(dy: Any, a: Any, b: Any, pre: Any = None, activation: str | None = None,
                    bias_grad: bool = True, tf32: bool = False,
                    plan: PlanLike | None = None) -> tuple[Any, Any, Any]:
    """(da, db, dbias) of ``y = act(a @ b + bias)`` given ``dy``.

    ``a`` is (m, k) or (batch, m, k), ``b`` (k, n) or (batch, k, n), ``dy`` the shape of y;
    ``pre`` (y's shape) is the activation's input, needed when ``activation`` is not None.
    A 3-D ``a`` with a 2-D ``b`` (a linear layer over a batch of sequences) gives a 2-D
    ``db`` summed over the batch. ``dbias`` is None when ``bias_grad`` is false.
    """
    checks.require("matmul_backward", ("dy", "a", "b"), (dy, a, b))
    act = "none" if activation is None else str(activation)
    if act not in ACTIVATIONS:
        raise UsageError(f"matmul_backward: activation={activation!r} is not supported",
                         hint="use None, 'relu', 'gelu' or 'silu'")
    if act != "none" and pre is None:
        raise UsageError(f"matmul_backward: activation={act!r} needs pre (a @ b + bias)",
                         hint="keep the forward's pre-activation output and pass it as pre")
    # Not one CallSpec: this is a composite (a pre-pass with no op of its own, then two
    # ``matmul`` calls, each of which takes the call pipeline's cached fast path itself), so
    # there is no single problem key or kernel to cache a Site for. ``bind`` only gives the
    # pre-pass backend arrays; torch / foreign tensors recurse on them, on the caller's stream.
    bound = bind(dy, a, b, pre)
    if bound.foreign:  # the pre-pass and both products on the caller's stream
        return bound.recurse(matmul_backward, activation=activation, bias_grad=bias_grad,
                             tf32=tf32, plan=plan)
    xp = bound.backend.xp
    dya, aa, ba, pa = bound.arrays
    if len(aa.shape) not in (2, 3) or len(ba.shape) not in (2, 3):
        raise ShapeError(f"matmul_backward: a {_shape(aa)} and b {_shape(ba)} must be 2-D "
                         "or 3-D")
    if len(aa.shape) == 2 and len(ba.shape) == 3:
        raise ShapeError("matmul_backward: a 2-D a with a 3-D b is not supported",
                         hint="broadcast a to (batch, m, k) first")
    m, k = _shape(aa)[-2:]
    n = _shape(ba)[-1]
    batch = _shape(aa)[0] if len(aa.shape) == 3 else None
    want = (m, n) if batch is None else (batch, m, n)
    if _shape(dya) != want:
        raise ShapeError(f"matmul_backward: dy has shape {_shape(dya)}, expected {want} "
                         f"(the shape of a @ b)")
    if pa is not None and _shape(pa) != want:
        raise ShapeError(f"matmul_backward: pre has shape {_shape(pa)}, expected {want}")
    dya = xp.ascontiguousarray(dya)
    pa = None if pa is None or act == "none" else xp.ascontiguousarray(pa)
    if xp is np:
        dyp, dbias = _prepass_numpy(dya, pa, act, bias_grad)
    else:
        dyp, dbias = _prepass_cuda(dya, pa, act, bias_grad, xp)
    da = matmul(dyp, ba.swapaxes(-1, -2), tf32=tf32, plan=plan)
    if batch is not None and len(ba.shape) == 2:  # shared weight: reduce over the batch too
        db = matmul(aa.reshape(batch * m, k).swapaxes(0, 1), dyp.reshape(batch * m, n),
                    tf32=tf32, plan=plan)
    else:
        db = matmul(aa.swapaxes(-1, -2), dyp, tf32=tf32, plan=plan)
    return da, db, dbias
