"""CPU row-norm variants (numpy backend): ``bwd_numpy`` (backward), ``numpy_whole`` and
``numpy_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Problem
from dnnctl.ops.passes import NumpyBackward, NumpyVariant, f32_or_none
from dnnctl.ops.registry import register_variant
from dnnctl.ops.rownorm.backward import LAYER_NORM_BACKWARD, RMS_NORM_BACKWARD
from dnnctl.ops.rownorm.op import rownorm_numpy


class _NormNumpy(NumpyVariant):
    rms = False

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        step = params.get("chunk_rows", problem["rows"])
        w, b = f32_or_none(inputs.get("weight")), f32_or_none(inputs.get("bias"))
        eps = float(attrs.get("eps", 1e-6 if self.rms else 1e-5))
        for r in range(0, x.shape[0], step):
            mc.put(y[r:r + step], rownorm_numpy(mc.f32(x[r:r + step]), w, b, eps, self.rms))


for _op, _spec in (("layer_norm", LAYER_NORM_BACKWARD), ("rms_norm", RMS_NORM_BACKWARD)):
    _title = "".join(p.title() for p in _op.split("_"))
    register_variant(NumpyBackward.of(_op, _spec, "fp32 numpy"))
    register_variant(type(f"{_title}NumpyWhole", (_NormNumpy,), {
        "op": _op, "name": "numpy_whole", "doc": "whole-tensor fp32 numpy",
        "rms": _op == "rms_norm", "__module__": __name__}))
    register_variant(type(f"{_title}NumpyRows", (_NormNumpy,), {
        "op": _op, "name": "numpy_rows", "doc": "fp32 numpy over cache-sized blocks of rows",
        "params": {"chunk_rows": (16, 256, 4096)}, "rms": _op == "rms_norm",
        "__module__": __name__}))


# ----------------------------------------------------------------------------- public API


