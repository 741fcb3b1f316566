"""The public group_norm gradient call (``dnnctl.ops.group_norm_backward``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import spatial_args
from dnnctl.ops.dispatch import bind, run

__all__ = ["group_norm_backward"]


def group_norm_backward(dy: Any, x: Any, groups: int, weight: Any = None, mean: Any = None,
                        rstd: Any = None, eps: float = 1e-5, layout: str = "NCHW",
                        plan: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`group_norm`: ``(dx, dweight, dbias)`` (fp32 (C,), None without a
    weight). ``mean`` / ``rstd`` (N, groups) fp32 are recomputed when omitted."""
    bound = bind(dy, x, weight, mean, rstd)
    ga, xa, wa, ma, ra = bound.arrays
    layout = mc.check_layout(layout)
    (n, c, h, w), dtype = spatial_args("group_norm_backward", ga, xa, layout)
    groups = int(groups)
    if groups < 1 or c % groups:
        raise ShapeError(f"group_norm_backward: {c} channels are not divisible into {groups} "
                         "groups")
    mc.check_vector(wa, c, "float32", "weight")
    shape4 = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    if ma is None or ra is None:  # on the caller's stream and allocator
        xp = bound.backend.xp
        with bound.on_caller_stream():
            xf = xa.reshape(shape4).astype(np.float32)
            xg = xf.reshape(n, groups, -1) if layout == "NCHW" else xp.moveaxis(
                xf.reshape(n, h * w, groups, c // groups), 2, 1).reshape(n, groups, -1)
            ma = xg.mean(axis=-1)
            ra = (1.0 / xp.sqrt(((xg - ma[:, :, None]) ** 2).mean(axis=-1) + eps)).astype(
                np.float32)
            ma = ma.astype(np.float32)
    key = {"n": n, "c": c, "h": h, "w": w, "groups": groups, "dtype": dtype, "layout": layout,
           "affine": wa is not None, "pass": "backward"}
    arrays = [ga.reshape(shape4), xa.reshape(shape4), wa, ma.reshape(n, groups),
              ra.reshape(n, groups)]
    res = run("group_norm", key, bound.with_arrays(arrays),
              ("dy", "x", "weight", "mean", "rstd"), {"eps": float(eps)}, plan=plan)
    dx = bound.wrap(res["dx"].reshape(xa.shape))
    return dx, *(bound.wrap(res[k]) if k in res else None for k in ("dweight", "dbias"))
