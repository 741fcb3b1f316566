"""The public batch_norm call (``dnnctl.ops.batch_norm``): arrays -> problem key -> plan
-> variant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import affine_pair, dims_of
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs


def _parse_bn(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, rm, rv, w, b, out, z, nrm, nrv = arrays
    training, momentum, eps, layout, return_stats, activation = scalars
    training = bool(training)
    activation = check_activation(activation, "batch_norm")
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
    w2, b2 = affine_pair(xp, w, b, c)
    if w is None and w2 is not None:
        consts["weight"] = w2
    if b is None and b2 is not None:
        consts["bias"] = b2
    for v, name in ((rm, "running_mean"), (rv, "running_var"), (w2, "weight"), (b2, "bias")):
        mc.check_vector(v, c, "float32", name)
    mc.check_out(out, shape, dtype)
    mc.check_like(z, shape, dtype, "residual")
    key = {"n": n, "c": c, "h": h, "w": wd, "dtype": dtype, "layout": layout,
           "training": training, "affine": w2 is not None, "activation": activation,
           "residual": z is not None}
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0),
             "momentum": mc.as_float(momentum, "momentum")}
    x4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    inputs = (("x", 0, None), ("running_mean", 1, None), ("running_var", 2, None),
              ("weight", 3, None), ("bias", 4, None))
    if z is not None:
        inputs = (*inputs, ("residual", 6, None))
    given: tuple[tuple[str, Any], ...] = ()
    if (nrm is None) != (nrv is None) or (nrm is not None and not training):
        raise UsageError("batch_norm: new_running takes both new running statistics, and "
                         "only in training", hint="pass (new_mean, new_var) with "
                         "training=True, or leave it out")
    if training and nrm is not None:  # the updated statistics into the caller's arrays
        for v, name in ((nrm, "new_running_mean"), (nrv, "new_running_var")):
            mc.check_vector(v, c, "float32", name)
            mc.writeable(v, name)
        given = (("new_running_mean", 7), ("new_running_var", 8))
    elif training:  # the running statistics are updated in place (kernels allow the alias)
        for v, name in ((rm, "running_mean"), (rv, "running_var")):
            mc.writeable(v, name)  # both before either is written
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
    views = {"x": x4, "y": x4, "residual": x4}
    return Parsed("batch_norm", key, inputs, outputs, given, attrs, consts, result,
                  kernel_shapes=views, like={"y": 0})


_BN = CallSpec("batch_norm", _parse_bn)


def batch_norm(x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5, layout: str = "NCHW", plan: Any = None, *, out: Any = None,
               return_stats: bool = False, activation: str = "none",
               residual: Any = None, new_running: tuple[Any, Any] | None = None) -> Any:
    """Batch normalization forward over x of rank 2..4 (channel axis per ``layout``).

    Parameters and statistics are fp32 (C,). Inference normalizes with the running
    statistics. Training normalizes with the batch statistics and updates ``running_mean`` /
    ``running_var`` in place (momentum, unbiased variance, as PyTorch); with
    ``return_stats=True`` it returns ``(y, save_mean, save_invstd)``. ``activation="relu"``
    returns relu(batch_norm(x)) from the same pass (its gradient:
    ``batch_norm_backward(..., bias=bias, activation="relu")``). ``residual`` (x's shape and
    dtype) is added before the activation: relu(batch_norm(x) + residual), a ResNet block's
    end, in the same pass. ``new_running=(new_mean, new_var)`` (training; fp32 (C,) arrays)
    takes the updated running statistics instead, leaving ``running_mean`` /
    ``running_var`` as they were (a functional caller's: no copy of them first).
    """
    nrm, nrv = (None, None) if new_running is None else new_running
    # (the order of CALL_ARRAYS)
    return call(_BN, (x, running_mean, running_var, weight, bias, out, residual, nrm, nrv),
                (bool(training), momentum, eps, layout, bool(return_stats), activation), plan)


# the call's arrays, in the order batch_norm hands them to its call site: callers that
# enter the site directly (dnnctl.torch) and the replay's C++ node name them by this
CALL_ARRAYS = ("x", "running_mean", "running_var", "weight", "bias", "out", "residual",
               "new_mean", "new_var")


def check_activation(activation: Any, who: str) -> str:
    """``activation`` of a batch_norm call: "none" (or None) or "relu"."""
    if activation is None:
        return "none"
    if activation not in ("none", "relu"):
        raise UsageError(f"{who}: activation={activation!r} is not fused; use 'none' or "
                         "'relu'", hint="apply other activations after the call")
    return activation

