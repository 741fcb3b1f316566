"""The softmax op: key schema, float64 reference, tolerances, counts and default heuristic.

softmax and log_softmax over the last axis (rows of 1 .. 256k+ elements).

Op key ``softmax``: rows, cols, dtype, log. CUDA variants (kernels/softmax/):
``warp_row`` (TPR threads per row, row in registers), ``block_row`` (block per row, row in
registers), ``block_smem`` (block per row staged in shared memory), ``async_smem`` (the same
staged by cp.async), ``online`` (single-pass
online max/sum, second read for the output; any length) and ``split_row`` (few long rows split
across blocks; two launches). CPU variants: ``numpy_whole`` and ``numpy_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Choice, Field, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op
from dnnctl.ops.softmax.backward import SOFTMAX_BACKWARD


def softmax_numpy(x: np.ndarray, log: bool) -> np.ndarray:
    """Row softmax in x's precision; NaN / +inf in a row make the row NaN (as the kernels)."""
    with np.errstate(all="ignore"):
        m = x.max(axis=-1, keepdims=True)
        z = x - m
        e = np.exp(z)
        s = e.sum(axis=-1, keepdims=True)
        return z - np.log(s) if log else e / s


@register_op
@with_backward(SOFTMAX_BACKWARD)
class SoftmaxOp(mc.MemoryOp):
    name = "softmax"
    doc = "softmax / log_softmax over the last axis of a (rows, cols) tensor"
    fields = {**mr.ROW_FIELDS, "log": Field("bool", False, doc="log_softmax"),
              "pass": PASS_FIELD}

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (problem["rows"], problem["cols"])
        x = rng.standard_normal(shape, dtype=np.float32) * 3
        return {"x": x.astype(np_dtype(problem["dtype"]))}

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": softmax_numpy(np.asarray(inputs["x"], np.float64), problem["log"])}

    def flops(self, problem: Problem) -> float:
        return 5.0 * problem["rows"] * problem["cols"]

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        return mr.default_row_choice(problem, backend, device, "softmax")
