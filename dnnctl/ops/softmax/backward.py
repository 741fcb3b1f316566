"""softmax / log_softmax backward: op ``softmax`` with ``pass: backward``.

Inputs: the forward's output ``y`` and the upstream gradient ``dy`` (rows, cols); output
``dx``. softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
CUDA variants (kernels/softmax/backward.cu): ``bwd_warp_row`` (TPR threads per row, rows in
registers), ``bwd_block_row`` (a block per row, rows in registers) and ``bwd_stream`` (a block
per row, two reads; any length). CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Choice, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import BackwardSpec, f64, term_scale


def softmax_backward_numpy(y: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """dx of softmax (log=False) or log_softmax (log=True) from y and dy, in their precision."""
    with np.errstate(all="ignore"):
        if log:
            return dy - np.exp(y) * dy.sum(axis=-1, keepdims=True)
        return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def softmax_dx_scale(y: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """|y| (|dy| + |sum(dy y)|) (log_softmax: |dy| + |exp(y) sum(dy)|): the terms dx is the
    sum of (a row of length 1 has y = 1 (0 for log) and dx = 0 exactly)."""
    with np.errstate(all="ignore"):
        if log:
            return term_scale(dy, np.exp(y) * dy.sum(axis=-1, keepdims=True))
        return np.abs(y) * term_scale(dy, (dy * y).sum(axis=-1, keepdims=True))


class SoftmaxBackward(BackwardSpec):
    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        spec = TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])
        return {"y": spec, "dy": spec}

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        return {"dx": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape, dt = (problem["rows"], problem["cols"]), np_dtype(problem["dtype"])
        x = rng.standard_normal(shape) * 3
        with np.errstate(all="ignore"):
            m = x.max(axis=-1, keepdims=True)
            z = x - m
            s = np.log(np.exp(z).sum(axis=-1, keepdims=True))
            y = z - s if problem["log"] else np.exp(z - s)
        return {"y": y.astype(dt), "dy": rng.standard_normal(shape).astype(dt)}

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return {"dx": softmax_backward_numpy(inputs["y"], inputs["dy"], problem["log"])}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": softmax_dx_scale(up["y"], up["dy"], problem["log"])}

    def flops(self, op: Op, problem: Problem) -> float:
        return 4.0 * problem["rows"] * problem["cols"]

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        cols, dtype = problem["cols"], problem["dtype"]
        vec = max(v for v in mc.VECS if mc.vec_fits(dtype, v) and cols % v == 0)
        from dnnctl.ops.registry import get_variant

        cands = [("bwd_warp_row", {"block": 128, "vec": vec,
                                   "tpr": min(32, mr.next_pow2(mc.cdiv(cols, vec * 4)))}),
                 ("bwd_block_row", {"block": min(1024, max(128, mr.next_pow2(
                     mc.cdiv(cols, vec * 4)))), "vec": vec})]
        for name, params in cands:
            v = get_variant("softmax", "cupy", name)
            if v.supports(problem, device) and v.valid_params(problem, params, device):
                return Choice.of(name, params)
        return Choice.of("bwd_stream", {"block": 1024 if cols >= 8192 else 256, "vec": vec})


SOFTMAX_BACKWARD = SoftmaxBackward()
