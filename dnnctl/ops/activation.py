"""Activations (relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh) with an optional fused
per-channel bias, in-place or out-of-place.

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

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import codes
from dnnctl.ops.activation_bwd import ACTIVATION_BACKWARD
from dnnctl.ops.base import (
    DTYPES,
    SUPPORTED,
    Choice,
    Field,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    Variant,
    dtype_size,
    np_dtype,
    unsupported,
)
from dnnctl.ops.dispatch import CallSpec, Parsed, call
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op, register_variant

FNS: tuple[str, ...] = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
ACT_CODE = {fn: codes.ACT[fn] for fn in FNS}  # dnnctl::Act in common.cuh
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_K_TANH = math.sqrt(2.0 / math.pi)


def act_numpy(fn: str, x: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """The activation in x's float precision (float64 for the reference, float32 on CPU).

    GELU uses forms without cancellation for negative x (as the kernels do):
    0.5 x erfc(-x / sqrt 2) and, for the tanh form, x / (1 + exp(-2 u)) = 0.5 x (1 + tanh u).
    """
    with np.errstate(all="ignore"):
        if fn == "relu":
            return np.maximum(x, 0)  # NaN propagates, as in torch and the kernels
        if fn == "leaky_relu":
            return np.where(x > 0, x, x * slope)
        if fn == "gelu":
            return 0.5 * x * mc.erfc(-x * _SQRT1_2).astype(x.dtype, copy=False)
        if fn == "gelu_tanh":
            return x / (1.0 + np.exp(-2.0 * _K_TANH * (x + 0.044715 * x * x * x)))
        if fn == "silu":
            return x / (1.0 + np.exp(-x))
        if fn == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if fn == "tanh":
            return np.tanh(x)
    raise UsageError(f"unknown activation {fn!r}", hint=f"use one of {', '.join(FNS)}")


geometry = mc.channel_geometry  # (elements, inner, channels) of an activation problem


def _bias_vec_ok(problem: Problem, vec: int) -> bool:
    """With a bias, a vector must hold one channel (NCHW) or whole channel runs (NHWC)."""
    if vec == 1 or problem["bias"] == "none":
        return True
    _, inner, channels = geometry(problem)
    return (inner if problem["layout"] == "NCHW" else channels) % vec == 0


@register_op
@with_backward(ACTIVATION_BACKWARD)
class ActivationOp(Op):
    name = "activation"
    doc = "y = act(x [+ bias per channel]); relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh"
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
            x = x + _broadcast_bias(problem, np.asarray(inputs["bias"], dtype=np.float64))
        return {"y": act_numpy(problem["fn"], x, slope)}

    def tolerance(self, problem: Problem, output: str) -> float:
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[problem["dtype"]]

    def flops(self, problem: Problem) -> float:
        per = {"relu": 1, "leaky_relu": 2, "gelu": 20, "gelu_tanh": 15, "silu": 8,
               "sigmoid": 8, "tanh": 10}[problem["fn"]]
        return float(math.prod(problem["shape"]) * (per + (problem["bias"] != "none")))

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_blocked", {"chunk": 65536})
        vec = max(v for v in mc.VECS
                  if mc.vec_fits(problem["dtype"], v) and _bias_vec_ok(problem, v))
        if mc.cdiv(math.prod(problem["shape"]), 128) < 2**31:
            # round 1 on the H200 (relu, fp16 8192^2): exact_grid(128, 16-byte vectors, 1)
            # 68.4 us = 93% of copy; grid_stride(256, unroll 2, 8 blocks / SM) 74.7 us
            return Choice.of("exact_grid", {"block": 128, "vec": vec, "unroll": 1})
        return Choice.of("grid_stride", {"block": 256, "vec": vec, "unroll": 2,
                                         "blocks_per_sm": 8})


def _broadcast_bias(problem: Problem, bias: np.ndarray) -> np.ndarray:
    rank = len(problem["shape"])
    if problem["layout"] == "NHWC":
        return bias
    return bias.reshape((-1,) + (1,) * (rank - 2))


# ----------------------------------------------------------------------------- CUDA


class _ActKernel:
    """Launches the vector kernel when every pointer is aligned, else the VEC=1 kernel."""

    __slots__ = ("fast", "safe", "align", "sizes")
    flat_io = True  # reads only data pointers: any contiguous arrays of the problem's sizes

    def __init__(self, fast: mc.Launch, safe: mc.Launch, align: int, sizes: tuple) -> None:
        self.fast, self.safe, self.align = fast, safe, align
        self.sizes = fast.consts(*sizes)

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y, b = inputs["x"], outputs["y"], inputs.get("bias")
        go = self.fast if mc.aligned(self.align, x, y, b) else self.safe
        go((x, b, y, *self.sizes, go.f32(attrs.get("negative_slope", 0.01))))


class _ActCuda(Variant):
    op = "activation"
    backend = "cupy"
    kernel: str = ""
    params = {"block": (128, 256, 512), "vec": mc.VECS, "unroll": (1, 2, 4)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return mc.vec_fits(problem["dtype"], params["vec"]) and _bias_vec_ok(problem,
                                                                             params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def grid(self, nvec: int, tile: int, params: Mapping[str, Any], device: Any) -> int:
        return max(1, mc.cdiv(nvec, tile))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        n, inner, channels = geometry(problem)
        itype = mc.index_type(n)
        bias = 0 if problem["bias"] == "none" else (1 if problem["layout"] == "NCHW" else 2)
        defines = {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                   "ACT_FN": ACT_CODE[problem["fn"]], "BIAS": bias,
                   "INPLACE": int(problem["inplace"])}

        def name(b: int, v: int, u: int) -> str:
            return f"{self.kernel}<{b},{v},{u},{itype}>"

        block, unroll = params["block"], params["unroll"]
        vec = params["vec"] if self.valid_params(problem, params, device) else 1
        mod = mc.compile_cuda(self.source, defines,
                              [name(block, vec, unroll), name(block, 1, unroll)], device)
        tile = block * unroll
        fast = mc.launch(mod, name(block, vec, unroll), self.grid(n // vec, tile, params, device),
                         block)
        safe = mc.launch(mod, name(block, 1, unroll), self.grid(n, tile, params, device), block)
        sizes = tuple(mc.index_scalar(v, itype) for v in (n, inner, channels))
        return _ActKernel(fast, safe, vec * dtype_size(problem["dtype"]), sizes)


@register_variant
class ActExactGrid(_ActCuda):
    name = "exact_grid"
    source = "activation/exact_grid.cu"
    kernel = "act_exact"
    doc = "one pass; each thread handles `unroll` vectors; grid covers the tensor exactly"

    def supports(self, problem: Problem, device: Any) -> Support:
        if mc.cdiv(math.prod(problem["shape"]), 128) >= 2**31:
            return unsupported("more than 2^31 blocks: use grid_stride")
        return SUPPORTED


@register_variant
class ActGridStride(_ActCuda):
    name = "grid_stride"
    source = "activation/grid_stride.cu"
    kernel = "act_stride"
    doc = "blocks_per_sm x SMs resident blocks loop over the tensor"
    params = {**_ActCuda.params, "blocks_per_sm": (2, 4, 8)}

    def grid(self, nvec: int, tile: int, params: Mapping[str, Any], device: Any) -> int:
        return max(1, min(mc.cdiv(nvec, tile), mc.sm_count(device) * params["blocks_per_sm"]))


# ----------------------------------------------------------------------------- numpy


@register_variant
class ActNumpyWhole(Variant):
    op = "activation"
    backend = "numpy"
    name = "numpy_whole"
    doc = "whole-tensor fp32 ufuncs"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        fn = problem["fn"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x = mc.f32(inputs["x"])
            if "bias" in inputs:
                x = x + _broadcast_bias(problem, mc.f32(inputs["bias"]))
            mc.put(outputs["y"], act_numpy(fn, x, float(attrs.get("negative_slope", 0.01))))

        return kernel


@register_variant
class ActNumpyBlocked(Variant):
    op = "activation"
    backend = "numpy"
    name = "numpy_blocked"
    doc = "fp32 ufuncs over cache-sized chunks of rows"
    params = {"chunk": (8192, 65536, 524288)}

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        fn, chunk = problem["fn"], params["chunk"]
        n, inner, channels = geometry(problem)
        # rows of uniform bias: NCHW (N*C, inner) with bias per row; else (rows, C) per column
        per_row = problem["bias"] != "none" and problem["layout"] == "NCHW"
        cols = inner if per_row else (channels if problem["bias"] != "none" else min(n, chunk))
        rows = n // cols
        step = max(1, chunk // cols)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
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

        return kernel


# ----------------------------------------------------------------------------- public API


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, bias, out = arrays
    fn, inplace, layout, slope = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    shape = tuple(x.shape)
    if not shape or 0 in shape:
        raise ShapeError(f"{fn}: x has shape {shape}, expected at least one dimension and "
                         "no zero-size axis")
    layout = mc.check_layout(layout)
    if bias is not None:
        if layout == "NCHW" and len(shape) < 2:
            raise ShapeError(f"{fn}: a bias with layout NCHW needs x of rank >= 2, got {shape}",
                             hint="pass layout='NHWC' for a bias on the last axis")
        mc.check_vector(bias, shape[1] if layout == "NCHW" else shape[-1], dtype, "bias")
    if out is not None:
        mc.check_out(out, shape, dtype)
        same = mc.same_memory(out, x)
        if inplace and not same:
            raise ShapeError(f"{fn}: inplace=True but out is not x",
                             hint="pass out=x or leave out unset")
        inplace = inplace or same
    key = {"fn": fn, "shape": shape, "dtype": dtype,
           "bias": "none" if bias is None else "channel", "layout": layout, "inplace": inplace}
    inputs = (("x", 0, None), ("bias", 1, None))
    if out is not None:
        return Parsed("activation", key, inputs, (), (("y", 2),), {"negative_slope": slope},
                      result=2)
    if inplace:
        mc.writeable(x, "x (inplace=True)")
        return Parsed("activation", key, inputs, (), (("y", 0),), {"negative_slope": slope},
                      result=0)
    return Parsed("activation", key, inputs, (("y", shape, x.dtype),), (),
                  {"negative_slope": slope}, like={"y": 0})


_ACTIVATION = CallSpec("activation", _parse)


def _activation(fn: str, x: Any, bias: Any, out: Any, inplace: bool, layout: str, plan: Any,
                slope: float = 0.01) -> Any:
    return call(_ACTIVATION, (x, bias, out), (fn, inplace, layout, slope), plan)


def relu(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """max(x [+ bias], 0). ``bias`` (C,) on the channel axis of ``layout``; NaN propagates."""
    return _activation("relu", x, bias, out, inplace, layout, plan)


def leaky_relu(x: Any, negative_slope: float = 0.01, bias: Any = None, out: Any = None,
               plan: Any = None, *, inplace: bool = False, layout: str = "NCHW") -> Any:
    """x if x > 0 else negative_slope * x (after the optional channel bias)."""
    try:
        slope = float(negative_slope)
    except (TypeError, ValueError):
        slope = mc.as_float(negative_slope, "negative_slope")  # raises, naming it
    return _activation("leaky_relu", x, bias, out, inplace, layout, plan, slope)


def gelu(x: Any, approximate: str = "none", bias: Any = None, out: Any = None,
         plan: Any = None, *, inplace: bool = False, layout: str = "NCHW") -> Any:
    """GELU, exact erf form (``approximate='none'``) or the tanh form (``'tanh'``)."""
    if approximate not in ("none", "tanh"):
        raise UsageError(f"gelu: approximate={approximate!r}", hint="use 'none' or 'tanh'")
    fn = "gelu" if approximate == "none" else "gelu_tanh"
    return _activation(fn, x, bias, out, inplace, layout, plan)


def silu(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """x * sigmoid(x) (after the optional channel bias)."""
    return _activation("silu", x, bias, out, inplace, layout, plan)


def sigmoid(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
            inplace: bool = False, layout: str = "NCHW") -> Any:
    """1 / (1 + exp(-x)) (after the optional channel bias)."""
    return _activation("sigmoid", x, bias, out, inplace, layout, plan)


def tanh(x: Any, bias: Any = None, out: Any = None, plan: Any = None, *,
         inplace: bool = False, layout: str = "NCHW") -> Any:
    """tanh(x) (after the optional channel bias)."""
    return _activation("tanh", x, bias, out, inplace, layout, plan)
