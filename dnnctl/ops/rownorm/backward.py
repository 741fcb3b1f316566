"""Row-norm backward: ops ``layer_norm`` / ``rms_norm`` with ``pass: backward`` (key
schema, float64 reference, statistics and default choice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Choice, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import GRAD_TOL, BackwardSpec, f64, term_scale

MAX_ELEMS = 16  # floats per thread per row (x and dy in registers, plus partials)


def row_stats(x: np.ndarray, eps: float, rms: bool) -> tuple[np.ndarray, np.ndarray]:
    """(mean, rstd) per row as the forward computes them (mean is zeros for rms_norm)."""
    if rms:
        return np.zeros(x.shape[0], x.dtype), 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    mean = x.mean(axis=-1)
    d = x - mean[:, None]
    return mean, 1.0 / np.sqrt(np.mean(d * d, axis=-1) + eps)


def rownorm_backward_numpy(dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                           mean: np.ndarray | None, rstd: np.ndarray,
                           rms: bool) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of layer_norm (rms=False) / rms_norm in the inputs' precision."""
    with np.errstate(all="ignore"):
        xh = (x if rms else x - mean[:, None]) * rstd[:, None]
        g = dy * w if w is not None else dy
        n = x.shape[-1]
        dot = (g * xh).sum(axis=-1, keepdims=True) / n
        inner = g - xh * dot
        if not rms:
            inner = inner - g.sum(axis=-1, keepdims=True) / n
        return {"dx": rstd[:, None] * inner, "dweight": (dy * xh).sum(axis=0),
                "dbias": dy.sum(axis=0)}


def rownorm_dx_scale(dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                     mean: np.ndarray | None, rstd: np.ndarray, rms: bool) -> np.ndarray:
    """rstd (|g| + |mean(g)| + |xhat mean(g xhat)|) (rms: without mean(g)): the terms dx is
    the sum of; a row of length 1 has dx = 0 exactly from terms of size rstd |g|."""
    with np.errstate(all="ignore"):
        xh = (x if rms else x - mean[:, None]) * rstd[:, None]
        g = dy * w if w is not None else dy
        n = x.shape[-1]
        terms = [g, xh * ((g * xh).sum(axis=-1, keepdims=True) / n)]
        if not rms:
            terms.append(g.sum(axis=-1, keepdims=True) / n)
        return rstd[:, None] * term_scale(*terms)


def param_specs(problem: Problem, prefix: str = "") -> dict[str, TensorSpec]:
    """The per-column ``weight`` / ``bias`` the key has (``prefix`` "d": their gradients)."""
    spec = TensorSpec((problem["cols"],), problem["dtype"])
    return {prefix + name: spec for name, on in (("weight", problem["weight"]),
                                                 ("bias", problem.get("bias", False))) if on}


class RowNormBackward(BackwardSpec):
    def __init__(self, rms: bool) -> None:
        self.rms = rms

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        rows, cols, dt = problem["rows"], problem["cols"], problem["dtype"]
        specs = {"dy": TensorSpec((rows, cols), dt), "x": TensorSpec((rows, cols), dt)}
        if problem["weight"]:
            specs["weight"] = TensorSpec((cols,), dt)
        if not self.rms:
            specs["mean"] = TensorSpec((rows,), "float32")
        specs["rstd"] = TensorSpec((rows,), "float32")
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        rows, cols, dt = problem["rows"], problem["cols"], problem["dtype"]
        return {"dx": TensorSpec((rows, cols), dt), **param_specs(problem, "d")}

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        rows, cols, dt = problem["rows"], problem["cols"], np_dtype(problem["dtype"])
        x = (rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt)
        mean, rstd = row_stats(x.astype(np.float64), op.attrs["eps"], self.rms)
        out = {"dy": rng.standard_normal((rows, cols)).astype(dt), "x": x}
        if problem["weight"]:
            out["weight"] = (rng.standard_normal(cols) * 0.5 + 1.0).astype(dt)
        if not self.rms:
            out["mean"] = mean.astype(np.float32)
        out["rstd"] = rstd.astype(np.float32)
        return out

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return rownorm_backward_numpy(inputs["dy"], inputs["x"], inputs.get("weight"),
                                      inputs.get("mean"), inputs["rstd"], self.rms)

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": rownorm_dx_scale(up["dy"], up["x"], up.get("weight"), up.get("mean"),
                                       up["rstd"], self.rms)}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]] * (5 if output != "dx" else 1)

    def flops(self, op: Op, problem: Problem) -> float:
        return 10.0 * problem["rows"] * problem["cols"]

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        cols, dtype = problem["cols"], problem["dtype"]
        vec = max(v for v in mc.VECS if mc.vec_fits(dtype, v) and cols % v == 0)
        tpr = mr.next_pow2(mc.cdiv(cols, MAX_ELEMS))  # the fewest threads holding a row
        tpr = tpr if tpr <= 32 else min(1024, max(128, tpr))
        params = {"block": max(128, tpr), "tpr": tpr, "vec": vec, "waves": 2}
        from dnnctl.ops.registry import get_variant

        for name in ("bwd_partials", "bwd_colpass"):
            v = get_variant(problem.op, "cupy", name)
            if v.supports(problem, device) and v.valid_params(problem, params, device):
                return Choice.of(name, params)
        return Choice.of("bwd_stream", {"block": 1024 if cols >= 8192 else 256, "vec": vec})


LAYER_NORM_BACKWARD = RowNormBackward(rms=False)
RMS_NORM_BACKWARD = RowNormBackward(rms=True)
