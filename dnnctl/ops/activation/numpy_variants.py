"""CPU activation variants (numpy backend, float32 arithmetic): ``numpy_whole`` and
``numpy_blocked`` (cache-sized chunks) for the forward pass, ``bwd_numpy`` for the backward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.backward import ACTIVATION_BACKWARD
from dnnctl.ops.activation.op import geometry
from dnnctl.ops.activation.reference import act_numpy
from dnnctl.ops.base import Problem
from dnnctl.ops.passes import NumpyBackward, NumpyVariant
from dnnctl.ops.registry import register_variant

register_variant(NumpyBackward.of("activation", ACTIVATION_BACKWARD,
                                  "fp32 numpy (float64 bias sums)"))


class _ActNumpy(NumpyVariant):
    """fp32 ufuncs over chunks of about ``chunk`` elements (the whole tensor without it)."""

    op = "activation"

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        n, inner, channels = geometry(problem)
        fn, chunk = problem["fn"], params.get("chunk", n)
        # rows of uniform bias: NCHW (N*C, inner) with bias per row; else (rows, C) per column
        per_row = problem["bias"] != "none" and problem["layout"] == "NCHW"
        cols = inner if per_row else (channels if problem["bias"] != "none" else min(n, chunk))
        rows = n // cols
        step = max(1, chunk // cols)
        slope = float(attrs.get("negative_slope", 0.01))
        x = inputs["x"].reshape(-1)
        y = outputs["y"].reshape(-1)
        b = inputs.get("bias")
        bf = None if b is None else mc.f32(b)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            seg = mc.f32(x[r0 * cols:r1 * cols]).reshape(r1 - r0, cols)
            if bf is not None:
                seg = seg + (bf[np.arange(r0, r1) % channels, None] if per_row else bf)
            mc.put(y[r0 * cols:r1 * cols], act_numpy(fn, seg, slope).reshape(-1))
        tail = rows * cols
        if tail < n:  # no bias here (with a bias cols divides n)
            mc.put(y[tail:], act_numpy(fn, mc.f32(x[tail:]), slope))


@register_variant
class ActNumpyWhole(_ActNumpy):
    name = "numpy_whole"
    doc = "whole-tensor fp32 ufuncs"


@register_variant
class ActNumpyBlocked(_ActNumpy):
    name = "numpy_blocked"
    doc = "fp32 ufuncs over cache-sized chunks of rows"
    params = {"chunk": (8192, 65536, 524288)}
