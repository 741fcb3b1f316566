"""The row normalizations layer_norm (rows, cols, dtype, weight, bias) and rms_norm
(rows, cols, dtype, weight) over the last axis: key schema, float64 reference,
tolerances, counts and default variant choice.
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
from dnnctl.ops.rownorm.backward import LAYER_NORM_BACKWARD, RMS_NORM_BACKWARD, param_specs


def rownorm_numpy(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float,
                  rms: bool) -> np.ndarray:
    """layer_norm / rms_norm of the rows of ``x`` in x's precision."""
    with np.errstate(all="ignore"):
        if rms:
            y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        else:
            mean = x.mean(axis=-1, keepdims=True)
            d = x - mean
            y = d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)
        if w is not None:
            y = y * w
        if b is not None:
            y = y + b
    return y


class _RowNormOp(mc.MemoryOp):
    rms = False

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        x = TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])
        return {"x": x, **param_specs(problem)}

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt = np_dtype(problem["dtype"])
        out = {}
        for name, spec in self.input_specs(problem).items():
            v = rng.standard_normal(spec.shape, dtype=np.float32)
            out[name] = (v * 2 + 0.5 if name == "x" else v).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        eps = float(attrs.get("eps", self.attrs["eps"]))
        return {"y": rownorm_numpy(up["x"], up.get("weight"), up.get("bias"), eps, self.rms)}

    def flops(self, problem: Problem) -> float:
        return 7.0 * problem["rows"] * problem["cols"]

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        return mr.default_row_choice(problem, backend, device, self.name, online="welford")


@register_op
@with_backward(LAYER_NORM_BACKWARD)
class LayerNormOp(_RowNormOp):
    name = "layer_norm"
    doc = "(x - mean) / sqrt(var + eps) * weight + bias over the last axis"
    fields = {**mr.ROW_FIELDS, "weight": Field("bool", True), "bias": Field("bool", True),
              "pass": PASS_FIELD}
    attrs = {"eps": 1e-5}


@register_op
@with_backward(RMS_NORM_BACKWARD)
class RmsNormOp(_RowNormOp):
    name = "rms_norm"
    doc = "x / sqrt(mean(x^2) + eps) * weight over the last axis"
    rms = True
    fields = {**mr.ROW_FIELDS, "weight": Field("bool", True), "pass": PASS_FIELD}
    attrs = {"eps": 1e-6}


