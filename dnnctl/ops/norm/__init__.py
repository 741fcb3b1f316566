"""Normalizations: layer_norm, rms_norm (rows), batch_norm, group_norm (N, C, H, W).

Importing this package registers the ops ``layer_norm``, ``rms_norm``, ``batch_norm`` and
``group_norm`` and their variants; the public functions below dispatch through the plan.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import Bound, Prepared, SiteCache, bind, run, signature
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


_FAST = SiteCache()


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
    sig = (training, momentum, eps, layout, return_stats)
    if out is None:  # a signature seen before: no validation
        try:
            prep, fills = _FAST[("bn", signature(x), signature(running_mean),
                                 signature(running_var), signature(weight), signature(bias),
                                 *sig)]
        except (AttributeError, KeyError, TypeError):
            pass
        else:
            return _bn_run(prep, fills, x, (running_mean, running_var, weight, bias), plan,
                           bool(training), bool(return_stats))
    bound = bind(x, running_mean, running_var, weight, bias, out)
    xa, rm, rv, wa, ba, oa = bound.arrays
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        res = batch_norm(xa, rm, rv, wa, ba, training, momentum, eps, layout, plan, out=oa,
                         return_stats=return_stats)
        if training and return_stats:
            y, save_mean, save_invstd = res
            return (out if out is not None else bound.wrap(y), bound.wrap(save_mean),
                    bound.wrap(save_invstd))
        return out if out is not None else bound.wrap(res)
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    given = (rm, rv, wa, ba)
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
    key = {"n": n, "c": c, "h": h, "w": w, "dtype": dtype, "layout": layout,
           "training": bool(training), "affine": wa is not None}
    attrs = {"eps": float(eps), "momentum": float(momentum)}
    if oa is None:
        # what the caller left out is made once per signature: identity affine halves, and
        # (training) running statistics nobody reads back
        fills = tuple(None if g is not None else a for g, a in zip(given, (rm, rv, wa, ba)))
        fills = fills if any(f is not None for f in fills) else None
        prep = Prepared("batch_norm", key, bound, attrs, {"x": xa.shape, "y": xa.shape},
                        given=("new_running_mean", "new_running_var") if training else ())
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put(("bn", signature(xa), *(signature(g) for g in given), *sig),
                      (prep, fills))
        return _bn_run(prep, fills, xa, given, plan, bool(training), bool(return_stats))
    x4 = xa.reshape((n, c, h, w) if layout == "NCHW" else (n, h, w, c))
    mc.check_out(oa, tuple(xa.shape), dtype)
    outs: dict[str, Any] = {"y": oa.reshape(x4.shape)}
    if training:  # the running statistics are updated in place (kernels allow the alias)
        outs["new_running_mean"], outs["new_running_var"] = rm, rv
    res = run("batch_norm", key, Bound(bound.backend, bound.device, [x4, rm, rv, wa, ba],
                                       bound.wrap),
              ("x", "running_mean", "running_var", "weight", "bias"), attrs, plan=plan,
              out=outs)
    if training and return_stats:
        return out, res["save_mean"], res["save_invstd"]
    return out


def _bn_run(prep: Prepared, fills: tuple | None, x: Any, given: tuple, plan: Any,
            training: bool, return_stats: bool) -> Any:
    rm, rv, w, b = given if fills is None else (
        a if a is not None else f for a, f in zip(given, fills))
    ins = {"x": x, "running_mean": rm, "running_var": rv}
    if w is not None:
        ins["weight"], ins["bias"] = w, b
    if not training:
        return prep.run(ins, plan)["y"]
    res = prep.run(ins, plan, {"new_running_mean": rm, "new_running_var": rv})
    return (res["y"], res["save_mean"], res["save_invstd"]) if return_stats else res["y"]


def group_norm(x: Any, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               layout: str = "NCHW", plan: Any = None, *, out: Any = None) -> Any:
    """Group normalization over (C/groups, H, W) per sample; weight / bias fp32 (C,)."""
    if out is None:  # a signature seen before: no validation
        try:
            prep, fills = _FAST[("gn", signature(x), groups, signature(weight),
                                 signature(bias), eps, layout)]
        except (AttributeError, KeyError, TypeError):
            pass
        else:
            return _gn_run(prep, fills, x, weight, bias, plan)
    bound = bind(x, weight, bias, out)
    xa, wa, ba, oa = bound.arrays
    if bound.foreign:  # DLPack tensors: run on the converted arrays, hand back the caller's kind
        y = group_norm(xa, groups, wa, ba, eps, layout, plan, out=oa)
        return out if out is not None else bound.wrap(y)
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    given_layout, layout = layout, mc.check_layout(layout)
    n, c, h, w = dims_of(tuple(xa.shape), layout, "group_norm")
    given_groups, groups = groups, int(groups)
    if groups < 1 or c % groups:
        raise ShapeError(f"group_norm: {c} channels are not divisible into {groups} groups")
    given = (wa, ba)
    wa, ba = _affine(bound.backend.xp, wa, ba, c)
    mc.check_vector(wa, c, "float32", "weight")
    mc.check_vector(ba, c, "float32", "bias")
    key = {"n": n, "c": c, "h": h, "w": w, "groups": groups, "dtype": dtype,
           "layout": layout, "affine": wa is not None}
    attrs = {"eps": float(eps)}
    if oa is None:
        fills = tuple(None if g is not None else a for g, a in zip(given, (wa, ba)))
        prep = Prepared("group_norm", key, bound, attrs, {"x": xa.shape, "y": xa.shape})
        with contextlib.suppress(AttributeError, TypeError):
            _FAST.put(("gn", signature(xa), given_groups, signature(given[0]),
                       signature(given[1]), eps, given_layout), (prep, fills))
        return _gn_run(prep, fills, xa, given[0], given[1], plan)
    x4 = xa.reshape((n, c, h, w) if layout == "NCHW" else (n, h, w, c))
    mc.check_out(oa, tuple(xa.shape), dtype)
    run("group_norm", key, Bound(bound.backend, bound.device, [x4, wa, ba], bound.wrap),
        ("x", "weight", "bias"), attrs, plan=plan, out={"y": oa.reshape(x4.shape)})
    return out


def _gn_run(prep: Prepared, fills: tuple, x: Any, w: Any, b: Any, plan: Any) -> Any:
    w = fills[0] if w is None else w
    b = fills[1] if b is None else b
    ins = {"x": x} if w is None else {"x": x, "weight": w, "bias": b}
    return prep.run(ins, plan)["y"]
