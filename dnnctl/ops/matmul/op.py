"""The matmul op: key schema, float64 reference, tolerances, counts and default heuristic.

Key (docs/ops.md): batch = 1, m, n, k, dtype, trans_a = false, trans_b = false, bias = false,
activation (none, relu, gelu, silu) = none, tf32 = false.

Tensors as the kernels see them (the *stored* layout): a is (batch, m, k), or (batch, k, m)
when trans_a; b is (batch, k, n), or (batch, n, k) when trans_b; bias (n,); y (batch, m, n).
With batch == 1 every operand is 2-D. Epilogue order: + bias, then the activation (gelu is
the erf form). Accumulation is fp32; tf32 (float32 only) lets kernels round inputs to TF32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import codes
from dnnctl.ops.activation.reference import FNS, act_numpy
from dnnctl.ops.base import DTYPES, Choice, Field, Op, Problem, TensorSpec, first_choice, np_dtype
from dnnctl.ops.costmodel import pick
from dnnctl.ops.registry import register_op, variants

ACTIVATIONS: tuple[str, ...] = ("none", "relu", "gelu", "silu")
# activation name -> dnnctl::Act code in kernels/include/dnnctl/common.cuh
# dnnctl::Act codes of the GEMM's epilogue activations
ACT_CODES: dict[str, int] = {a: codes.ACT[a] for a in ACTIVATIONS}


def activation_ref(y: np.ndarray, activation: str) -> np.ndarray:
    """An epilogue activation (matmul's, and conv2d's relu6 / hardswish) in y's precision
    (float64 for the reference): the activation op's own reference, so the two agree."""
    if activation == "none":
        return y
    if activation not in FNS:
        raise UsageError(f"unknown activation {activation!r}",
                         hint=f"use one of {', '.join(ACTIVATIONS)}")
    return act_numpy(activation, y)


def a_shape(problem: Problem) -> tuple[int, ...]:
    """Stored shape of ``a``."""
    m, k = problem["m"], problem["k"]
    tail = (k, m) if problem["trans_a"] else (m, k)
    return tail if problem["batch"] == 1 else (problem["batch"], *tail)


def b_shape(problem: Problem) -> tuple[int, ...]:
    """Stored shape of ``b``."""
    n, k = problem["n"], problem["k"]
    tail = (n, k) if problem["trans_b"] else (k, n)
    return tail if problem["batch"] == 1 else (problem["batch"], *tail)


def y_shape(problem: Problem) -> tuple[int, ...]:
    m, n = problem["m"], problem["n"]
    return (m, n) if problem["batch"] == 1 else (problem["batch"], m, n)


def logical_operands(problem: Problem, a: np.ndarray, b: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(batch, m, k) and (batch, k, n) views of the stored operands."""
    bt = problem["batch"]
    a3 = a.reshape((bt, *a.shape[-2:]))
    b3 = b.reshape((bt, *b.shape[-2:]))
    if problem["trans_a"]:
        a3 = a3.transpose(0, 2, 1)
    if problem["trans_b"]:
        b3 = b3.transpose(0, 2, 1)
    return a3, b3


@register_op
class Matmul(Op):
    """Batched matrix product y = act(a @ b + bias) with fp32 accumulation."""

    name = "matmul"
    doc = "matrix product (batched), optional transposed operands, fused bias + activation"
    fields = {
        "batch": Field("int", default=1, minimum=1, doc="independent products (3-D operands)"),
        "m": Field("int", minimum=1, doc="rows of a and y"),
        "n": Field("int", minimum=1, doc="columns of b and y"),
        "k": Field("int", minimum=1, doc="reduction length"),
        "dtype": Field("str", choices=DTYPES, doc="I/O dtype; accumulation is fp32"),
        "trans_a": Field("bool", default=False, doc="a is stored (k, m)"),
        "trans_b": Field("bool", default=False, doc="b is stored (n, k)"),
        "bias": Field("bool", default=False, doc="add a bias vector of length n"),
        "activation": Field("str", default="none", choices=ACTIVATIONS),
        "tf32": Field("bool", default=False, doc="allow TF32 math for float32 (as torch does)"),
    }

    def check(self, key: dict[str, Any]) -> None:
        """tf32 only means something for float32: canonicalized to false otherwise."""
        if key["dtype"] != "float32":
            key["tf32"] = False

    # -- tensors
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        dt = problem["dtype"]
        specs = {"a": TensorSpec(a_shape(problem), dt), "b": TensorSpec(b_shape(problem), dt)}
        if problem["bias"]:
            specs["bias"] = TensorSpec((problem["n"],), dt)
        return specs

    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(y_shape(problem), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Normal a, b scaled by 1/sqrt(k) (y stays O(1)), bias of std 0.5."""
        dt = np_dtype(problem["dtype"])
        scale = 1.0 / math.sqrt(problem["k"])
        out = {
            "a": rng.standard_normal(a_shape(problem), dtype=np.float32).astype(dt),
            "b": (rng.standard_normal(b_shape(problem), dtype=np.float32) * scale).astype(dt),
        }
        if problem["bias"]:
            out["bias"] = (rng.standard_normal((problem["n"],), dtype=np.float32) * 0.5
                           ).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """float64 product + epilogue."""
        a = np.asarray(inputs["a"], dtype=np.float64)
        b = np.asarray(inputs["b"], dtype=np.float64)
        a3, b3 = logical_operands(problem, a, b)
        y = np.matmul(a3, b3)
        if problem["bias"]:
            if "bias" not in inputs:
                raise UsageError("matmul: the key says bias=true but no bias was given")
            y = y + np.asarray(inputs["bias"], dtype=np.float64)
        y = activation_ref(y, problem["activation"])
        return {"y": np.ascontiguousarray(y.reshape(y_shape(problem)))}

    def tolerance(self, problem: Problem, output: str) -> float:
        """‖out − ref‖/‖ref‖: fp32 1e-5, tf32 1e-3 (inputs rounded to a 10-bit mantissa give
        ~4e-4), fp16 2e-3, bf16 8e-3 (output rounding alone is ~3e-4 / ~2e-3)."""
        dtype = problem["dtype"]
        if dtype == "float32":
            return 1e-3 if problem["tf32"] else 1e-5
        return {"float16": 2e-3, "bfloat16": 8e-3}[dtype]

    # -- roofline
    def flops(self, problem: Problem) -> float:
        return 2.0 * problem["batch"] * problem["m"] * problem["n"] * problem["k"]

    # -- heuristic
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        """numpy: np.matmul. CUDA: the cheapest candidate by the cost model
        (dnnctl/ops/matmul/cost.py); near-ties (within TIE) go to the earlier of FALLBACK.
        Variants without a cost function are tried in FALLBACK order when none has one."""
        if backend != "numpy":
            best = pick(ranked(problem, backend, device), FALLBACK)
            if best is not None:
                return Choice.of(best.variant, best.params)
        table = {v.name: v for v in variants(self.name, backend)}
        order = ["numpy", "blocked"] if backend == "numpy" else FALLBACK
        return first_choice(table, order + [n for n in table if n not in order], problem,
                            backend, device)


# tie order: the vendor libraries first; cuBLASLt before cuBLAS, as the same kernels with
# less host time a call (the algorithm is looked up once per problem and cached, where
# cublasGemmStridedBatchedEx chooses again on every call: see benchmarks/RESULTS.md)
FALLBACK = ["cublaslt", "cublas", "wgmma", "mma", "simt"]


def ranked(problem: Problem, backend: str, device: Any) -> list[Any]:
    """The cost model's estimates (dnnctl.ops.costmodel.Estimate), cheapest first: what
    default_choice picks from, and what explains the pick."""
    from dnnctl.ops.matmul import cost

    names = tuple(v.name for v in variants("matmul", backend))
    return cost.rank_memo(problem, backend, device, names)
