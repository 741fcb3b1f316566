"""The public group_norm gradient call (``dnnctl.ops.group_norm_backward``), on the forward's
call pipeline. Statistics the caller does not pass are recomputed in fp32 from ``x`` by the
call's ``prepare`` hook, on the caller's stream and allocator."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import spatial_args
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs

__all__ = ["group_norm_backward"]


def _group_stats(xp: Any, x4: Any, layout: str, groups: int, eps: float) -> tuple[Any, Any]:
    """(mean, rstd) fp32 (N, groups) of the backend array ``x4`` (4-D in ``layout``)."""
    n = x4.shape[0]
    xf = x4.astype(np.float32)
    if layout == "NCHW":
        xg = xf.reshape(n, groups, -1)
    else:
        _, h, w, c = x4.shape
        xg = xp.moveaxis(xf.reshape(n, h * w, groups, c // groups), 2, 1).reshape(n, groups, -1)
    mean = xg.mean(axis=-1)
    rstd = (1.0 / xp.sqrt(((xg - mean[:, :, None]) ** 2).mean(axis=-1) + eps)).astype(
        np.float32)
    return mean.astype(np.float32), rstd


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, x, w, mean, rstd = arrays
    groups, eps, layout = scalars
    layout = mc.check_layout(layout)
    (n, c, h, wd), dtype = spatial_args("group_norm_backward", dy, x, layout)
    try:
        groups = int(groups)
    except (TypeError, ValueError):
        groups = 0  # refused below, naming the value
    if groups < 1 or c % groups:
        raise ShapeError(f"group_norm_backward: {c} channels are not divisible into "
                         f"{scalars[0]!r} groups",
                         hint="groups must be a positive int dividing the channels")
    mc.check_vector(w, c, "float32", "weight")
    eps = mc.as_float(eps, "eps", minimum=0.0)
    given = mean is not None and rstd is not None
    if given:  # the forward's statistics: N * groups values each, read as fp32
        by_pointer = all([mc.check_stats(v, n * groups, f"group_norm_backward: {name}")
                          for v, name in ((mean, "mean"), (rstd, "rstd"))])
    key = {"n": n, "c": c, "h": h, "w": wd, "groups": groups, "dtype": dtype, "layout": layout,
           "affine": w is not None, "pass": "backward"}
    shape4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    affine = w is not None
    views = {"dy": shape4, "x": shape4, "dx": shape4, "mean": (n, groups),
             "rstd": (n, groups)}
    parsed = Parsed("group_norm", key, (("dy", 0, None), ("x", 1, None), ("weight", 2, None),
                                        ("mean", 3, None), ("rstd", 4, None)),
                    (("dx", tuple(x.shape), x.dtype), *spec_outputs("group_norm", key, ("dx",))),
                    (), {"eps": eps},
                    result=("dx", "dweight" if affine else None, "dbias" if affine else None),
                    kernel_shapes=views, like={"dx": 1})
    if given and by_pointer:
        return parsed

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        ga, xa, wa, ma, ra = back
        x4 = xa.reshape(shape4)
        if given:  # a strided or non-fp32 statistic: an fp32 contiguous copy
            ma, ra = (xp.ascontiguousarray(v.reshape(n, groups), dtype=np.float32)
                      for v in (ma, ra))
        else:
            ma, ra = _group_stats(xp, x4, layout, groups, eps)
        ins = {"dy": ga.reshape(shape4), "x": x4, "mean": ma, "rstd": ra}
        if wa is not None:
            ins["weight"] = wa
        return ins

    return replace(parsed, prepare=prepare)


_BACKWARD = CallSpec("group_norm_backward", _parse)


def group_norm_backward(dy: Any, x: Any, groups: int, weight: Any = None, mean: Any = None,
                        rstd: Any = None, eps: float = 1e-5, layout: str = "NCHW",
                        plan: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`group_norm`: ``(dx, dweight, dbias)`` (fp32 (C,), None without a
    weight). ``mean`` / ``rstd`` (N, groups) fp32 are recomputed when omitted."""
    return call(_BACKWARD, (dy, x, weight, mean, rstd), (groups, eps, layout), plan)
