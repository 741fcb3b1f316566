"""Batch-norm backward: op ``batch_norm`` with ``pass: backward`` (key schema, float64
reference and default choice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Choice, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import f64, term_scale


def bn_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                      mean: np.ndarray, invstd: np.ndarray) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of batch_norm training in the inputs' precision (sums in float64)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64)
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64)
        scale = invstd if w is None else invstd * w
        dx = scale.reshape(shape) * (dy - (sdy / count).reshape(shape)
                                     - xh * (sdx / count).reshape(shape))
    return {"dx": dx, "dweight": sdx, "dbias": sdy}


def bn_dx_scale(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                mean: np.ndarray, invstd: np.ndarray) -> np.ndarray:
    """|invstd w| (|dy| + |mean(dy)| + |xhat mean(dy xhat)|): the terms dx is the sum of (two
    elements per channel give xhat = +-1 and dx ~ 0 from terms of size invstd |dy|)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64) / count
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64) / count
        a = np.abs(invstd if w is None else invstd * w).reshape(shape)
        return a * term_scale(dy, sdy.reshape(shape), xh * sdx.reshape(shape))


class BatchNormBackward(sp.SpatialNormBackward):
    def check(self, op: Op, key: dict[str, Any]) -> None:
        if not key["training"]:
            raise UsageError("batch_norm: the backward pass is of training mode (batch "
                             "statistics)", hint="set training: true in the key")

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        c, t = problem["c"], TensorSpec(sp.tensor_shape(problem), problem["dtype"])
        specs = {"dy": t, "x": t}
        if problem["affine"]:
            specs["weight"] = TensorSpec((c,), "float32")
        specs["save_mean"] = TensorSpec((c,), "float32")
        specs["save_invstd"] = TensorSpec((c,), "float32")
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        c, shape, dt = problem["c"], sp.tensor_shape(problem), np_dtype(problem["dtype"])
        x = (rng.standard_normal(shape) * 1.5 + 0.7).astype(dt)
        axes = sp.reduce_axes(problem)
        xf = x.astype(np.float64)
        mean = xf.mean(axis=axes)
        var = np.square(xf - mean.reshape(sp.channel_shape(problem))).mean(axis=axes)
        out = {"dy": rng.standard_normal(shape).astype(dt), "x": x}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(c) * 0.5 + 1.0).astype(np.float32)
        out["save_mean"] = mean.astype(np.float32)
        out["save_invstd"] = (1.0 / np.sqrt(var + op.attrs["eps"])).astype(np.float32)
        return out

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return bn_backward_numpy(problem, inputs["dy"], inputs["x"], inputs.get("weight"),
                                 inputs["save_mean"], inputs["save_invstd"])

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": bn_dx_scale(problem, up["dy"], up["x"], up.get("weight"),
                                  up["save_mean"], up["save_invstd"])}

    def flops(self, op: Op, problem: Problem) -> float:
        return 7.0 * sp.numel(problem)

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        return Choice.of("bwd_reduce_dx", {"block": 256, "vec": sp.best_vec(problem),
                                           "waves": 4})


BATCH_NORM_BACKWARD = BatchNormBackward()


