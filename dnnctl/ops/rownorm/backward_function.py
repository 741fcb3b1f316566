"""The public row-norm gradient calls (``layer_norm_backward``, ``rms_norm_backward``) and
the forward calls that also return the saved statistics, on the call pipeline of
:mod:`dnnctl.ops.dispatch` (a repeated call with one signature skips parsing and plan
lookup). Statistics the caller does not pass (``mean`` / ``rstd``) are recomputed in fp32
from ``x`` (one extra read of x) by the call's ``prepare`` hook, on the caller's stream and
allocator.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs
from dnnctl.ops.rownorm.function import _parse as _parse_forward

__all__ = ["layer_norm_backward", "layer_norm_with_stats", "rms_norm_backward",
           "rms_norm_with_stats"]


def _row_stats(xp: Any, x: Any, rows: int, cols: int, eps: float, rms: bool) -> tuple:
    """(mean or None, rstd) fp32 per row of the backend array ``x``."""
    xf = x.reshape(rows, cols).astype(np.float32)
    if rms:
        return None, (1.0 / xp.sqrt((xf * xf).mean(axis=-1) + eps)).astype(np.float32)
    mean = xf.mean(axis=-1)
    var = ((xf - mean[:, None]) ** 2).mean(axis=-1)
    return mean.astype(np.float32), (1.0 / xp.sqrt(var + eps)).astype(np.float32)


def _parse_backward(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, x, w, mean, rstd = arrays
    op, eps, bias = scalars
    rms = op == "rms_norm"
    dtype = mc.float_dtype(x, "x")
    shape = mc.nonempty_shape(x, op)
    mc.contiguous(x, "x")
    mc.check_out(dy, shape, dtype, "dy")
    cols = shape[-1]
    rows = x.size // cols
    mc.check_vector(w, cols, dtype, "weight")
    eps = mc.as_float(eps, "eps", minimum=0.0)
    given = rstd is not None and (rms or mean is not None)
    if given:  # the forward's statistics: (rows,) values each, read as fp32 vectors
        by_pointer = all(mc.check_stats(v, rows, f"{op}_backward: {name}")
                         for v, name in ((mean, "mean"), (rstd, "rstd")) if v is not None)
    key: dict[str, Any] = {"rows": rows, "cols": cols, "dtype": dtype, "weight": w is not None,
                           "pass": "backward"}
    if not rms:
        key["bias"] = bias
    grads = spec_outputs(op, key, ("dx",))
    names = {n for n, _, _ in grads}
    result = ("dx", "dweight" if "dweight" in names else None)
    if not rms:
        result += ("dbias" if "dbias" in names else None,)
    views = {"dy": (rows, cols), "x": (rows, cols), "dx": (rows, cols), "mean": (rows,),
             "rstd": (rows,)}
    parsed = Parsed(op, key, (("dy", 0, None), ("x", 1, None), ("weight", 2, None),
                              ("mean", 3, None), ("rstd", 4, None)),
                    (("dx", shape, x.dtype), *grads), (), {"eps": eps}, result=result,
                    kernel_shapes=views, like={"dx": 1})
    if given and by_pointer:
        return parsed

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        ga, xa, wa, ma, ra = back
        if given:  # a strided or non-fp32 statistic: an fp32 contiguous copy
            ma, ra = (None if v is None else xp.ascontiguousarray(v.reshape(rows),
                                                                   dtype=np.float32)
                      for v in (ma, ra))
        else:
            ma, ra = _row_stats(xp, xa, rows, cols, eps, rms)
        ins = {"dy": ga.reshape(rows, cols), "x": xa.reshape(rows, cols), "rstd": ra}
        if wa is not None:
            ins["weight"] = wa
        if not rms:
            ins["mean"] = ma
        return ins

    return replace(parsed, prepare=prepare)


_BACKWARD = CallSpec("rownorm_backward", _parse_backward, ("dy",))


def layer_norm_backward(dy: Any, x: Any, weight: Any = None, mean: Any = None,
                        rstd: Any = None, eps: float = 1e-5, bias: bool = True,
                        plan: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``; dweight is None without a
    weight, dbias None when ``bias=False``. ``mean`` / ``rstd`` (rows,) fp32 are the forward's
    statistics (from :func:`layer_norm_with_stats`), recomputed when omitted."""
    return call(_BACKWARD, (dy, x, weight, mean, rstd), ("layer_norm", eps, bool(bias)), plan)


def rms_norm_backward(dy: Any, x: Any, weight: Any = None, rstd: Any = None,
                      eps: float = 1e-6, plan: Any = None) -> tuple[Any, Any]:
    """Gradients of :func:`rms_norm`: ``(dx, dweight)`` (dweight None without a weight)."""
    return call(_BACKWARD, (dy, x, weight, None, rstd), ("rms_norm", eps, False), plan)


def _parse_with_stats(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    """The forward's call, and a ``finish`` that adds the fp32 row statistics of x."""
    parsed = _parse_forward((*arrays, None), scalars, xp)
    rms = scalars[0] == "rms_norm"
    shape = tuple(arrays[0].shape)
    cols = shape[-1]
    rows = arrays[0].size // cols
    eps = parsed.attrs["eps"]

    def finish(kouts: dict[str, Any], back: tuple[Any, ...]) -> tuple[Any, ...]:
        mean, rstd = _row_stats(xp, back[0], rows, cols, eps, rms)
        y = kouts["y"].reshape(shape)
        return (y, rstd) if rms else (y, mean, rstd)

    return replace(parsed, finish=finish)


_WITH_STATS = CallSpec("rownorm_with_stats", _parse_with_stats)


def layer_norm_with_stats(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                          plan: Any = None) -> tuple[Any, Any, Any]:
    """:func:`layer_norm` plus the statistics its backward takes: ``(y, mean, rstd)``, the
    statistics fp32 (rows,). They cost one more read of x (the forward kernels keep them)."""
    return call(_WITH_STATS, (x, weight, bias), ("layer_norm", eps), plan)


def rms_norm_with_stats(x: Any, weight: Any = None, eps: float = 1e-6,
                        plan: Any = None) -> tuple[Any, Any]:
    """:func:`rms_norm` plus the fp32 (rows,) ``rstd`` its backward takes."""
    return call(_WITH_STATS, (x, weight, None), ("rms_norm", eps), plan)

