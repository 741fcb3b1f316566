"""CPU row-norm variants (numpy backend): ``bwd_numpy`` (backward), ``numpy_whole`` and
``numpy_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant
from dnnctl.ops.passes import NumpyBackward, f32_or_none
from dnnctl.ops.registry import register_variant
from dnnctl.ops.rownorm.backward import rownorm_backward_numpy
from dnnctl.ops.rownorm.op import rownorm_numpy


class _RowNormBwdNumpy(NumpyBackward):
    doc = "fp32 numpy"
    rms = False

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return rownorm_backward_numpy(
            mc.f32(inputs["dy"]), mc.f32(inputs["x"]), f32_or_none(inputs.get("weight")),
            f32_or_none(inputs.get("mean")), mc.f32(inputs["rstd"]), self.rms)


for _op in ("layer_norm", "rms_norm"):
    register_variant(type(f"{''.join(p.title() for p in _op.split('_'))}BwdNumpy",
                          (_RowNormBwdNumpy,), {"op": _op, "rms": _op == "rms_norm",
                                                "__module__": __name__}))


class _NormNumpy(Variant):
    backend = "numpy"
    rms = False

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        step = params.get("chunk_rows", problem["rows"])
        rms = self.rms

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            w = None if "weight" not in inputs else mc.f32(inputs["weight"])
            b = None if "bias" not in inputs else mc.f32(inputs["bias"])
            eps = float(attrs.get("eps", 1e-6 if rms else 1e-5))
            for r in range(0, x.shape[0], step):
                mc.put(y[r:r + step], rownorm_numpy(mc.f32(x[r:r + step]), w, b, eps, rms))

        return kernel


for _op in ("layer_norm", "rms_norm"):
    _title = "".join(p.title() for p in _op.split("_"))
    register_variant(type(f"{_title}NumpyWhole", (_NormNumpy,), {
        "op": _op, "name": "numpy_whole", "doc": "whole-tensor fp32 numpy",
        "rms": _op == "rms_norm", "__module__": __name__}))
    register_variant(type(f"{_title}NumpyRows", (_NormNumpy,), {
        "op": _op, "name": "numpy_rows", "doc": "fp32 numpy over cache-sized blocks of rows",
        "params": {"chunk_rows": (16, 256, 4096)}, "rms": _op == "rms_norm",
        "__module__": __name__}))


# ----------------------------------------------------------------------------- public API


