"""The public row-norm gradient calls (``layer_norm_backward``, ``rms_norm_backward``) and
the forward calls that also return the saved statistics. Statistics the caller does not
pass (``mean`` / ``rstd``) are recomputed in fp32 from ``x`` (one extra read of x).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import Bound, bind, run

__all__ = ["layer_norm_backward", "layer_norm_with_stats", "rms_norm_backward",
           "rms_norm_with_stats"]


def _rows(op: str, dy: Any, x: Any) -> tuple[int, int, str]:
    dtype = mc.float_dtype(x, "x")
    shape = mc.nonempty_shape(x, op)
    mc.contiguous(x, "x")
    mc.check_out(dy, shape, dtype, "dy")
    return x.size // shape[-1], shape[-1], dtype


def _row_stats(bound: Bound, x: Any, rows: int, cols: int, eps: float, rms: bool) -> tuple:
    """(mean or None, rstd) fp32 per row, computed on the caller's stream and allocator."""
    xp = bound.backend.xp
    with bound.on_caller_stream():
        xf = x.reshape(rows, cols).astype(np.float32)
        if rms:
            return None, (1.0 / xp.sqrt((xf * xf).mean(axis=-1) + eps)).astype(np.float32)
        mean = xf.mean(axis=-1)
        var = ((xf - mean[:, None]) ** 2).mean(axis=-1)
        return mean.astype(np.float32), (1.0 / xp.sqrt(var + eps)).astype(np.float32)


def _row_backward(op: str, dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, eps: float,
                  bias: bool, plan: Any) -> Any:
    rms = op == "rms_norm"
    bound = bind(dy, x, weight, mean, rstd)
    ga, xa, wa, ma, ra = bound.arrays
    rows, cols, dtype = _rows(op, ga, xa)
    mc.check_vector(wa, cols, dtype, "weight")
    if ra is None or (not rms and ma is None):
        ma, ra = _row_stats(bound, xa, rows, cols, eps, rms)
    for v, name in ((ma, "mean"), (ra, "rstd")):
        if v is not None and v.size != rows:
            raise ShapeError(f"{op}_backward: {name} has {v.size} values, expected {rows}")
    key: dict[str, Any] = {"rows": rows, "cols": cols, "dtype": dtype, "weight": wa is not None,
                           "pass": "backward"}
    if not rms:
        key["bias"] = bool(bias)
    arrays = [ga.reshape(rows, cols), xa.reshape(rows, cols), wa,
              None if rms else ma.reshape(rows), ra.reshape(rows)]
    res = run(op, key, bound.with_arrays(arrays),
              ("dy", "x", "weight", "mean", "rstd"), {"eps": float(eps)}, plan=plan)
    dx = bound.wrap(res["dx"].reshape(xa.shape))
    grads = [bound.wrap(res[k]) if k in res else None for k in ("dweight", "dbias")]
    return (dx, grads[0]) if rms else (dx, *grads)


def layer_norm_backward(dy: Any, x: Any, weight: Any = None, mean: Any = None,
                        rstd: Any = None, eps: float = 1e-5, bias: bool = True,
                        plan: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``; dweight is None without a
    weight, dbias None when ``bias=False``. ``mean`` / ``rstd`` (rows,) fp32 are the forward's
    statistics (from :func:`layer_norm_with_stats`), recomputed when omitted."""
    return _row_backward("layer_norm", dy, x, weight, mean, rstd, eps, bias, plan)


def rms_norm_backward(dy: Any, x: Any, weight: Any = None, rstd: Any = None,
                      eps: float = 1e-6, plan: Any = None) -> tuple[Any, Any]:
    """Gradients of :func:`rms_norm`: ``(dx, dweight)`` (dweight None without a weight)."""
    return _row_backward("rms_norm", dy, x, weight, None, rstd, eps, False, plan)


def layer_norm_with_stats(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                          plan: Any = None) -> tuple[Any, Any, Any]:
    """:func:`layer_norm` plus the statistics its backward takes: ``(y, mean, rstd)``, the
    statistics fp32 (rows,). They cost one more read of x (the forward kernels keep them)."""
    from dnnctl.ops.rownorm.function import layer_norm

    y = layer_norm(x, weight, bias, eps, plan)
    bound = bind(x)
    xa = bound.arrays[0]
    mean, rstd = _row_stats(bound, xa, xa.size // xa.shape[-1], xa.shape[-1], eps, False)
    return y, bound.wrap(mean), bound.wrap(rstd)


def rms_norm_with_stats(x: Any, weight: Any = None, eps: float = 1e-6,
                        plan: Any = None) -> tuple[Any, Any]:
    """:func:`rms_norm` plus the fp32 (rows,) ``rstd`` its backward takes."""
    from dnnctl.ops.rownorm.function import rms_norm

    y = rms_norm(x, weight, eps, plan)
    bound = bind(x)
    xa = bound.arrays[0]
    _, rstd = _row_stats(bound, xa, xa.size // xa.shape[-1], xa.shape[-1], eps, True)
    return y, bound.wrap(rstd)

