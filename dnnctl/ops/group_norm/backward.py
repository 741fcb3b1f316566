"""Group-norm backward: op ``group_norm`` with ``pass: backward`` (key schema, float64
reference, statistics and default choice).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Choice, Op, Problem
from dnnctl.ops.passes import term_scale


def _grouped(problem: Problem, a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    n, c, h, w, g = problem["n"], problem["c"], problem["h"], problem["w"], problem["groups"]
    if problem["layout"] == "NCHW":
        return a.reshape(n, g, c // g, h, w), (2, 3, 4)
    return a.reshape(n, h, w, g, c // g), (1, 2, 4)


def _stat_shape(problem: Problem) -> tuple[int, ...]:
    n, g = problem["n"], problem["groups"]
    return (n, g, 1, 1, 1) if problem["layout"] == "NCHW" else (n, 1, 1, g, 1)


def gn_stats(problem: Problem, x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, rstd) per (sample, group) as the forward computes them, float64."""
    xg, axes = _grouped(problem, x.astype(np.float64))
    mean = xg.mean(axis=axes)
    var = np.square(xg - mean.reshape(_stat_shape(problem))).mean(axis=axes)
    return mean, 1.0 / np.sqrt(var + eps)


def gn_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                      mean: np.ndarray, rstd: np.ndarray) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of group_norm in the inputs' precision."""
    xg, axes = _grouped(problem, x)
    dyg, _ = _grouped(problem, dy)
    st = _stat_shape(problem)
    cshape = sp.channel_shape(problem)
    with np.errstate(all="ignore"):
        xh = (xg - mean.reshape(st)) * rstd.reshape(st)
        gg = dyg if w is None else _grouped(problem, dy * w.reshape(cshape))[0]
        count = math.prod(xg.shape[a] for a in axes)
        s1 = gg.sum(axis=axes, keepdims=True) / count
        s2 = (gg * xh).sum(axis=axes, keepdims=True) / count
        dx = (rstd.reshape(st) * (gg - s1 - xh * s2)).reshape(x.shape)
        red = sp.reduce_axes(problem)
        xh_full = xh.reshape(x.shape)
        return {"dx": dx, "dweight": (dy * xh_full).sum(axis=red, dtype=np.float64),
                "dbias": dy.sum(axis=red, dtype=np.float64)}


def gn_dx_scale(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                mean: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """rstd (|g| + |mean(g)| + |xhat mean(g xhat)|) per group: the terms dx is the sum of."""
    xg, axes = _grouped(problem, x)
    st = _stat_shape(problem)
    with np.errstate(all="ignore"):
        xh = (xg - mean.reshape(st)) * rstd.reshape(st)
        gg = _grouped(problem, dy if w is None else dy * w.reshape(sp.channel_shape(problem)))[0]
        count = math.prod(xg.shape[a] for a in axes)
        s1 = gg.sum(axis=axes, keepdims=True) / count
        s2 = (gg * xh).sum(axis=axes, keepdims=True) / count
        return (rstd.reshape(st) * term_scale(gg, s1, xh * s2)).reshape(x.shape)


class GroupNormBackward(sp.SpatialNormBackward):
    stats = ("mean", "rstd")
    x_offset = 0.3
    numpy = staticmethod(gn_backward_numpy)
    dx_scale = staticmethod(gn_dx_scale)
    saved_stats = staticmethod(gn_stats)

    def stat_shape(self, problem: Problem) -> tuple[int, ...]:
        return (problem["n"], problem["groups"])

    def flops(self, op: Op, problem: Problem) -> float:
        return 8.0 * sp.numel(problem)

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        return Choice.of("bwd_sums_dx", {"block": 256, "vec": sp.best_vec(problem)})


GROUP_NORM_BACKWARD = GroupNormBackward()

