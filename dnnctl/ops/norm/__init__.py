"""Normalizations: layer_norm, rms_norm (rows), batch_norm, group_norm (N, C, H, W).

Importing this package registers the ops ``layer_norm``, ``rms_norm``, ``batch_norm`` and
``group_norm`` and their variants; the public functions below dispatch through the plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs
from dnnctl.ops.norm import (  # noqa: F401  (registration)
    batchnorm,
    bn_exact,
    bn_onepass,
    gn_async,
    groupnorm,
    rownorm,
)
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


def _parse_bn(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, rm, rv, w, b, out = arrays
    training, momentum, eps, layout, return_stats = scalars
    training = bool(training)
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(layout)
    shape = tuple(x.shape)
    n, c, h, wd = dims_of(shape, layout, "batch_norm")
    if not training and (rm is None or rv is None):
        raise ShapeError("batch_norm: inference needs running_mean and running_var",
                         hint="pass both, or training=True to use batch statistics")
    # what the caller left out is made once per signature: identity affine halves, and
    # (training) running statistics nobody reads back
    consts: dict[str, Any] = {}
    if rm is None:
        rm = consts["running_mean"] = xp.zeros(c, dtype=np.float32)
    if rv is None:
        rv = consts["running_var"] = xp.ones(c, dtype=np.float32)
    w2, b2 = _affine(xp, w, b, c)
    if w is None and w2 is not None:
        consts["weight"] = w2
    if b is None and b2 is not None:
        consts["bias"] = b2
    for v, name in ((rm, "running_mean"), (rv, "running_var"), (w2, "weight"), (b2, "bias")):
        mc.check_vector(v, c, "float32", name)
    mc.check_out(out, shape, dtype)
    key = {"n": n, "c": c, "h": h, "w": wd, "dtype": dtype, "layout": layout,
           "training": training, "affine": w2 is not None}
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0),
             "momentum": mc.as_float(momentum, "momentum")}
    x4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    inputs = (("x", 0, None), ("running_mean", 1, None), ("running_var", 2, None),
              ("weight", 3, None), ("bias", 4, None))
    given: tuple[tuple[str, Any], ...] = ()
    if training:  # the running statistics are updated in place (kernels allow the alias)
        given = (("new_running_mean", 1 if "running_mean" not in consts else "running_mean"),
                 ("new_running_var", 2 if "running_var" not in consts else "running_var"))
    skip = ("y", "new_running_mean", "new_running_var")
    outputs = spec_outputs("batch_norm", key, skip)
    if out is None:
        outputs = (("y", shape, x.dtype), *outputs)
    else:
        given = (*given, ("y", 5))
    y: str | int = "y" if out is None else 5
    result: Any = y
    if training and return_stats:
        result = ("y" if out is None else "y", "save_mean", "save_invstd")
    views = {"x": x4, "y": x4}
    return Parsed("batch_norm", key, inputs, outputs, given, attrs, consts, result,
                  kernel_shapes=views, like={"y": 0})


_BN = CallSpec("batch_norm", _parse_bn)


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
    return call(_BN, (x, running_mean, running_var, weight, bias, out),
                (bool(training), momentum, eps, layout, bool(return_stats)), plan)


def _parse_gn(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, w, b, out = arrays
    groups, eps, layout = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(layout)
    shape = tuple(x.shape)
    n, c, h, wd = dims_of(shape, layout, "group_norm")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or c % groups:
        raise ShapeError(f"group_norm: {c} channels are not divisible into {groups!r} groups",
                         hint="groups must be a positive int dividing the channels")
    consts: dict[str, Any] = {}
    w2, b2 = _affine(xp, w, b, c)
    if w is None and w2 is not None:
        consts["weight"] = w2
    if b is None and b2 is not None:
        consts["bias"] = b2
    mc.check_vector(w2, c, "float32", "weight")
    mc.check_vector(b2, c, "float32", "bias")
    mc.check_out(out, shape, dtype)
    key = {"n": n, "c": c, "h": h, "w": wd, "groups": groups, "dtype": dtype,
           "layout": layout, "affine": w2 is not None}
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0)}
    x4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    inputs = (("x", 0, None), ("weight", 1, None), ("bias", 2, None))
    views = {"x": x4, "y": x4}
    if out is not None:
        return Parsed("group_norm", key, inputs, (), (("y", 3),), attrs, consts,
                      3, kernel_shapes=views)
    return Parsed("group_norm", key, inputs, (("y", shape, x.dtype),), (),
                  attrs, consts, kernel_shapes=views, like={"y": 0})


_GN = CallSpec("group_norm", _parse_gn)


def group_norm(x: Any, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               layout: str = "NCHW", plan: Any = None, *, out: Any = None) -> Any:
    """Group normalization over (C/groups, H, W) per sample; weight / bias fp32 (C,)."""
    return call(_GN, (x, weight, bias, out), (groups, eps, layout), plan)
