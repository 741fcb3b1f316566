"""The activation op: key schema, float64 reference, tolerances, counts and default
heuristic.

Activations (relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh, relu6, hardswish,
hardsigmoid) with an optional fused per-channel bias, in-place or out-of-place.

Op key ``activation``: fn, shape, dtype, bias (none | channel), layout (channel axis 1 for NCHW,
last axis for NHWC; canonically NCHW when there is no bias), inplace. CUDA variants
(kernels/activation/): ``exact_grid`` (one pass, grid sized to the tensor) and ``grid_stride``
(resident blocks loop), each over block size, vector width (elements per access, up to 16
bytes) and vectors per thread. CPU variants: ``numpy_whole`` and ``numpy_blocked``
(cache-sized chunks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import codes
from dnnctl.ops.activation.backward import ACTIVATION_BACKWARD
from dnnctl.ops.activation.reference import FNS, act_numpy, broadcast_bias
from dnnctl.ops.base import DTYPES, Choice, Field, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op

ACT_CODE = {fn: codes.ACT[fn] for fn in FNS}  # dnnctl::Act in common.cuh


geometry = mc.channel_geometry  # (elements, inner, channels) of an activation problem


def bias_vec_ok(problem: Problem, vec: int) -> bool:
    """With a bias, a vector must hold one channel (NCHW) or whole channel runs (NHWC)."""
    if vec == 1 or problem["bias"] == "none":
        return True
    _, inner, channels = geometry(problem)
    return (inner if problem["layout"] == "NCHW" else channels) % vec == 0


@register_op
@with_backward(ACTIVATION_BACKWARD)
class ActivationOp(mc.MemoryOp):
    name = "activation"
    doc = ("y = act(x [+ bias per channel]); relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, "
           "tanh, relu6, hardswish, hardsigmoid")
    fields = {
        "fn": Field("str", choices=FNS, doc="activation function"),
        "shape": Field("ints", minimum=1, doc="tensor shape, any rank"),
        "dtype": Field("str", choices=DTYPES),
        "bias": Field("str", "none", choices=("none", "channel")),
        "layout": Field("str", "NCHW", choices=("NCHW", "NHWC")),
        "inplace": Field("bool", False),
        "pass": PASS_FIELD,
    }
    attrs = {"negative_slope": 0.01}

    def check(self, key: dict[str, Any]) -> None:
        if key["bias"] == "none":
            key["layout"] = "NCHW"  # layout only places the bias: one key per tensor shape
        elif key["layout"] == "NCHW" and len(key["shape"]) < 2:
            raise UsageError("activation: a channel bias with layout NCHW needs rank >= 2",
                             hint="use layout NHWC for a bias on the last axis")

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"x": TensorSpec(problem["shape"], problem["dtype"])}
        if problem["bias"] == "channel":
            specs["bias"] = TensorSpec((geometry(problem)[2],), problem["dtype"])
        return specs

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(problem["shape"], problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt = np_dtype(problem["dtype"])
        out = {"x": (rng.standard_normal(problem["shape"], dtype=np.float32) * 2).astype(dt)}
        if problem["bias"] == "channel":
            c = geometry(problem)[2]
            out["bias"] = (rng.standard_normal(c, dtype=np.float32) * 0.5).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        x = np.asarray(inputs["x"], dtype=np.float64)
        slope = float(attrs.get("negative_slope", 0.01))
        if "bias" not in inputs and problem["dtype"] != "float32" and problem["fn"] == "gelu":
            # 16-bit inputs take at most 65536 values: evaluate the function once per value
            dt = np_dtype(problem["dtype"])
            with np.errstate(invalid="ignore"):
                every = np.arange(65536, dtype=np.uint16).view(dt).astype(np.float64)
            table = act_numpy("gelu", every)
            return {"y": table[x.astype(dt).view(np.uint16)]}
        if "bias" in inputs:
            x = x + broadcast_bias(problem, np.asarray(inputs["bias"], dtype=np.float64))
        return {"y": act_numpy(problem["fn"], x, slope)}

    def flops(self, problem: Problem) -> float:
        per = {"relu": 1, "leaky_relu": 2, "gelu": 20, "gelu_tanh": 15, "silu": 8,
               "sigmoid": 8, "tanh": 10, "relu6": 2, "hardswish": 5,
               "hardsigmoid": 4}[problem["fn"]]
        return float(math.prod(problem["shape"]) * (per + (problem["bias"] != "none")))

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_blocked", {"chunk": 65536})
        vec = max(v for v in mc.VECS
                  if mc.vec_fits(problem["dtype"], v) and bias_vec_ok(problem, v))
        if mc.cdiv(math.prod(problem["shape"]), 128) < 2**31:
            # round 1 on the H200 (relu, fp16 8192^2): exact_grid(128, 16-byte vectors, 1)
            # 68.4 us = 93% of copy; grid_stride(256, unroll 2, 8 blocks / SM) 74.7 us
            return Choice.of("exact_grid", {"block": 128, "vec": vec, "unroll": 1})
        return Choice.of("grid_stride", {"block": 256, "vec": vec, "unroll": 2,
                                         "blocks_per_sm": 8})
