"""Normalizations: layer_norm, rms_norm (rows), batch_norm, group_norm (N, C, H, W).

Importing this package registers the ops ``layer_norm``, ``rms_norm``, ``batch_norm`` and
``group_norm`` and their variants; the public functions below dispatch through the plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import Bound, bind, run
from dnnctl.ops.norm import batchnorm, groupnorm, rownorm  # noqa: F401  (registration)
from dnnctl.ops.norm._spatial import dims_of
from dnnctl.ops.norm.rownorm import layer_norm, rms_norm

__all__ = ["batch_norm", "group_norm", "layer_norm", "rms_norm"]


def _affine(xp: Any, weight: Any, bias: Any, c: int) -> tuple[Any, Any]:
    """Both or neither: a missing half of an affine pair is the identity (1 or 0)."""
    if weight is None and bias is None:
        return None, None
    if weight is None:
        weight = xp.ones(c, dtype=np.float32)
    if bias is None:
        bias = xp.zeros(c, dtype=np.float32)
    return weight, bias


def batch_norm(x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5, layout: str = "NCHW", plan: Any = None, *, out: Any = None,
               return_stats: bool = False) -> Any:
    """Batch normalization forward over x of rank 2..4 (channel axis per ``layout``).

    Parameters and statistics are fp32 (C,). Inference normalizes with the running
    statistics. Training normalizes with the batch statistics and updates ``running_mean`` /
    ``running_var`` in place (momentum, unbiased variance, as PyTorch); with
    ``return_stats=True`` it returns ``(y, save_mean, save_invstd)``.
    """
    bound = bind(x, running_mean, running_var, weight, bias, out)
    xa, rm, rv, wa, ba, oa = bound.arrays
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    layout = mc.check_layout(layout)
    n, c, h, w = dims_of(tuple(xa.shape), layout, "batch_norm")
    xp = bound.backend.xp
    if not training and (rm is None or rv is None):
        raise ShapeError("batch_norm: inference needs running_mean and running_var",
                         hint="pass both, or training=True to use batch statistics")
    rm = xp.zeros(c, dtype=np.float32) if rm is None else rm
    rv = xp.ones(c, dtype=np.float32) if rv is None else rv
    wa, ba = _affine(xp, wa, ba, c)
    for v, name in ((rm, "running_mean"), (rv, "running_var"), (wa, "weight"), (ba, "bias")):
        mc.check_vector(v, c, "float32", name)
    x4 = xa.reshape((n, c, h, w) if layout == "NCHW" else (n, h, w, c))
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout,
           "training": bool(training), "affine": wa is not None}
    outs: dict[str, Any] = {}
    if oa is not None:
        mc.check_out(oa, tuple(xa.shape), dtype)
        outs["y"] = oa.reshape(x4.shape)
    if training:  # the running statistics are updated in place (kernels allow the alias)
        outs["new_running_mean"], outs["new_running_var"] = rm, rv
    res = run("batch_norm", key, Bound(bound.backend, bound.device, [x4, rm, rv, wa, ba],
                                       bound.wrap),
              ("x", "running_mean", "running_var", "weight", "bias"),
              {"eps": float(eps), "momentum": float(momentum)}, plan=plan, out=outs or None)
    y = out if oa is not None else bound.wrap(res["y"].reshape(xa.shape))
    if training and return_stats:
        return y, bound.wrap(res["save_mean"]), bound.wrap(res["save_invstd"])
    return y


def group_norm(x: Any, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               layout: str = "NCHW", plan: Any = None, *, out: Any = None) -> Any:
    """Group normalization over (C/groups, H, W) per sample; weight / bias fp32 (C,)."""
    bound = bind(x, weight, bias, out)
    xa, wa, ba, oa = bound.arrays
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    layout = mc.check_layout(layout)
    n, c, h, w = dims_of(tuple(xa.shape), layout, "group_norm")
    groups = int(groups)
    if groups < 1 or c % groups:
        raise ShapeError(f"group_norm: {c} channels are not divisible into {groups} groups")
    wa, ba = _affine(bound.backend.xp, wa, ba, c)
    mc.check_vector(wa, c, "float32", "weight")
    mc.check_vector(ba, c, "float32", "bias")
    x4 = xa.reshape((n, c, h, w) if layout == "NCHW" else (n, h, w, c))
    key = {"n": n, "c": c, "h": h, "w": w, "groups": groups, "dtype": dtype,
           "layout": layout, "affine": wa is not None}
    if oa is not None:
        mc.check_out(oa, tuple(xa.shape), dtype)
    res = run("group_norm", key, Bound(bound.backend, bound.device, [x4, wa, ba], bound.wrap),
              ("x", "weight", "bias"), {"eps": float(eps)}, plan=plan,
              out=None if oa is None else {"y": oa.reshape(x4.shape)})
    return out if oa is not None else bound.wrap(res["y"].reshape(xa.shape))
