"""The public batch_norm gradient call (``dnnctl.ops.batch_norm_backward``)."""

from __future__ import annotations

from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import spatial_args
from dnnctl.ops.dispatch import bind, run

__all__ = ["batch_norm_backward"]


def batch_norm_backward(dy: Any, x: Any, save_mean: Any, save_invstd: Any, weight: Any = None,
                        layout: str = "NCHW", plan: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of training-mode :func:`batch_norm` from its saved statistics (the
    ``return_stats=True`` outputs): ``(dx, dweight, dbias)``, the last two fp32 (C,), both
    None without a weight."""
    bound = bind(dy, x, weight, save_mean, save_invstd)
    ga, xa, wa, ma, sa = bound.arrays
    layout = mc.check_layout(layout)
    (n, c, h, w), dtype = spatial_args("batch_norm_backward", ga, xa, layout)
    for v, name in ((wa, "weight"), (ma, "save_mean"), (sa, "save_invstd")):
        mc.check_vector(v, c, "float32", name)
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout, "training": True,
           "affine": wa is not None, "pass": "backward"}
    shape4 = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    arrays = [ga.reshape(shape4), xa.reshape(shape4), wa, ma, sa]
    res = run("batch_norm", key, bound.with_arrays(arrays),
              ("dy", "x", "weight", "save_mean", "save_invstd"), {}, plan=plan)
    dx = bound.wrap(res["dx"].reshape(xa.shape))
    return dx, *(bound.wrap(res[k]) if k in res else None for k in ("dweight", "dbias"))

