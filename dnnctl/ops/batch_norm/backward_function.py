"""The public batch_norm gradient call (``dnnctl.ops.batch_norm_backward``), on the forward's
call pipeline."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import spatial_args
from dnnctl.ops.batch_norm.function import check_activation
from dnnctl.ops.dispatch import CallSpec, Parsed, call, spec_outputs

__all__ = ["batch_norm_backward"]


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    dy, x, w, mean, invstd, b, z = arrays
    layout = mc.check_layout(scalars[0])
    activation = check_activation(scalars[1], "batch_norm_backward")
    (n, c, h, wd), dtype = spatial_args("batch_norm_backward", dy, x, layout)
    for v, name in ((mean, "save_mean"), (invstd, "save_invstd")):
        if v is None:  # no eps here to recompute them with: the forward's are the ones
            raise ShapeError(f"batch_norm_backward: {name} is required, got None",
                             hint="pass the statistics of batch_norm(..., training=True, "
                                  "return_stats=True)")
    relu_bias = activation == "relu" and w is not None
    if relu_bias and b is None:
        raise ShapeError("batch_norm_backward: activation='relu' with a weight needs the "
                         "forward's bias (the ReLU's mask is recomputed from x)",
                         hint="pass bias=, the same array the forward took")
    for v, name in ((w, "weight"), (mean, "save_mean"), (invstd, "save_invstd"),
                    (b if relu_bias else None, "bias")):
        mc.check_vector(v, c, "float32", name)
    if z is not None:
        if activation != "relu":
            raise UsageError("batch_norm_backward: residual= is for activation='relu' "
                             "(without the ReLU the residual's gradient is dy itself)",
                             hint="leave residual out and pass dy on as is")
        mc.check_like(z, tuple(x.shape), dtype, "residual")
    key = {"n": n, "c": c, "h": h, "w": wd, "dtype": dtype, "layout": layout, "training": True,
           "affine": w is not None, "activation": activation, "residual": z is not None,
           "pass": "backward"}
    shape4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    grads = spec_outputs("batch_norm", key, ("dx", "dresidual"))
    affine = w is not None
    made = (("dx", tuple(x.shape), x.dtype),)
    if z is not None:
        made += (("dresidual", tuple(x.shape), x.dtype),)
    inputs = (("dy", 0, None), ("x", 1, None), ("weight", 2, None), ("save_mean", 3, None),
              ("save_invstd", 4, None))
    if relu_bias:
        inputs = (*inputs, ("bias", 5, None))
    if z is not None:
        inputs = (*inputs, ("residual", 6, None))
    result: tuple = ("dx", "dweight" if affine else None, "dbias" if affine else None)
    shapes = {"dy": shape4, "x": shape4, "dx": shape4}
    if z is not None:
        result += ("dresidual",)
        shapes.update(residual=shape4, dresidual=shape4)
    return Parsed("batch_norm", key, inputs, (*made, *grads), result=result,
                  kernel_shapes=shapes, like={"dx": 1, "dresidual": 1})


_BACKWARD = CallSpec("batch_norm_backward", _parse)


def batch_norm_backward(dy: Any, x: Any, save_mean: Any, save_invstd: Any, weight: Any = None,
                        layout: str = "NCHW", plan: Any = None, *, bias: Any = None,
                        activation: str = "none", residual: Any = None) -> tuple[Any, ...]:
    """Gradients of training-mode :func:`batch_norm` from its saved statistics (the
    ``return_stats=True`` outputs): ``(dx, dweight, dbias)``, the last two fp32 (C,), both
    None without a weight. ``activation="relu"``: of relu(batch_norm(x)), dy being the
    gradient of that output; the ReLU's mask is recomputed from x, the statistics, weight
    and ``bias`` (the forward's), so no activation needs to be kept. With the forward's
    ``residual`` (relu(batch_norm(x) + residual)): ``(dx, dweight, dbias, dresidual)``."""
    # (the order of CALL_ARRAYS)
    return call(_BACKWARD, (dy, x, weight, save_mean, save_invstd, bias, residual),
                (layout, activation), plan)


# the call's arrays, in the order batch_norm_backward hands them to its call site (see
# function.CALL_ARRAYS)
CALL_ARRAYS = ("dy", "x", "weight", "save_mean", "save_invstd", "bias", "residual")
