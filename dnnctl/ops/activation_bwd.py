"""Activation backward: op ``activation`` with ``pass: backward``.

Inputs: ``dy``, the forward's input ``x`` and, with ``bias: channel``, the ``bias``; outputs
``dx = dy * act'(x + bias)`` and, with a bias, its gradient ``dbias`` (the sum of dx per
channel) fused into the same pass. CUDA variants (kernels/activation/backward.cu):
``bwd_stream`` (no bias: a grid-stride vector stream) and ``bwd_channel`` (channel bias:
channel-stationary blocks write dx and partial bias sums, a finishing sum per channel).
CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
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
from dnnctl.ops.passes import GRAD_TOL, BackwardSpec, NumpyBackward, f32_or_none, f64
from dnnctl.ops.registry import register_variant

_K_TANH = math.sqrt(2.0 / math.pi)
CODES = {fn: i + 1 for i, fn in enumerate(
    ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"))}


def act_grad_numpy(fn: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """d act / dz in z's precision; NaN propagates."""
    with np.errstate(all="ignore"):
        if fn == "relu":
            out = np.where(z > 0, 1.0, 0.0).astype(z.dtype)
        elif fn == "leaky_relu":
            out = np.where(z > 0, 1.0, slope).astype(z.dtype)
        elif fn == "gelu":
            cdf = 0.5 * mc.erfc(-z / math.sqrt(2.0)).astype(z.dtype, copy=False)
            out = cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        elif fn == "gelu_tanh":
            t = np.tanh(_K_TANH * (z + 0.044715 * z ** 3))
            out = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K_TANH * (1 + 3 * 0.044715 * z * z)
        elif fn in ("silu", "sigmoid"):
            s = 1.0 / (1.0 + np.exp(-z))
            out = s * (1 + z * (1 - s)) if fn == "silu" else s * (1 - s)
        elif fn == "tanh":
            out = 1.0 - np.tanh(z) ** 2
        else:
            raise UsageError(f"unknown activation {fn!r}")
        return np.where(np.isnan(z), z, out)


_geometry = mc.channel_geometry  # (elements, inner, channels), as the forward's


def _bias_shape(problem: Problem) -> tuple[int, ...]:
    rank, (_, _, c) = len(problem["shape"]), _geometry(problem)
    if problem["layout"] == "NHWC":
        return (c,)
    return (1, c) + (1,) * (rank - 2)


def act_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, bias: Any,
                       slope: float) -> dict[str, np.ndarray]:
    z = x if bias is None else x + bias.reshape(_bias_shape(problem))
    dx = dy * act_grad_numpy(problem["fn"], z, slope)
    out = {"dx": dx}
    if bias is not None:
        axes = tuple(i for i in range(dx.ndim)
                     if i != (dx.ndim - 1 if problem["layout"] == "NHWC" else 1))
        out["dbias"] = dx.sum(axis=axes, dtype=np.float64)
    return out


class ActivationBackward(BackwardSpec):
    def check(self, op: Op, key: dict[str, Any]) -> None:
        if key["inplace"]:
            raise UsageError("activation: the backward pass has no in-place form",
                             hint="set inplace: false in the key")

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        t = TensorSpec(problem["shape"], problem["dtype"])
        specs = {"dy": t, "x": t}
        if problem["bias"] == "channel":
            specs["bias"] = TensorSpec((_geometry(problem)[2],), problem["dtype"])
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"dx": TensorSpec(problem["shape"], problem["dtype"])}
        if problem["bias"] == "channel":
            specs["dbias"] = TensorSpec((_geometry(problem)[2],), problem["dtype"])
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt, shape = np_dtype(problem["dtype"]), problem["shape"]
        out = {"dy": rng.standard_normal(shape).astype(dt),
               "x": (rng.standard_normal(shape) * 2).astype(dt)}
        if problem["bias"] == "channel":
            out["bias"] = (rng.standard_normal(_geometry(problem)[2]) * 0.5).astype(dt)
        return out

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return act_backward_numpy(problem, up["dy"], up["x"], up.get("bias"),
                                  float(attrs.get("negative_slope", 0.01)))

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]] * (1 if output == "dx" else 2)

    def flops(self, op: Op, problem: Problem) -> float:
        return 12.0 * math.prod(problem["shape"])

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("bwd_numpy")
        name = "bwd_channel" if problem["bias"] == "channel" else "bwd_stream"
        vec = max(v for v in mc.VECS if _vec_ok(problem, v))
        return Choice.of(name, {"block": 256, "vec": vec, "waves": 4})


ACTIVATION_BACKWARD = ActivationBackward()


def _vec_ok(problem: Problem, vec: int) -> bool:
    if not mc.vec_fits(problem["dtype"], vec):
        return False
    n, inner, c = _geometry(problem)
    if problem["bias"] == "none":
        return n % vec == 0
    return (inner if problem["layout"] == "NCHW" else c) % vec == 0


# ----------------------------------------------------------------------------- CUDA


class _ActBwdKernel:
    __slots__ = ("fast", "safe", "align")
    flat_io = True

    def __init__(self, fast: Any, safe: Any, align: int) -> None:
        self.fast, self.safe, self.align = fast, safe, align

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        dy, x, dx = inputs["dy"], inputs["x"], outputs["dx"]
        go = self.fast if mc.aligned(self.align, dy, x, dx) else self.safe
        go(dy, x, inputs.get("bias"), dx, outputs.get("dbias"),
           float(attrs.get("negative_slope", 0.01)))


class _ActBwdCuda(Variant):
    op = "activation"
    backend = "cupy"
    passes = ("backward",)
    source = "activation/backward.cu"
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}
    bias = "none"

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["bias"] != self.bias:
            return unsupported(f"bias {self.bias} only")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return _vec_ok(problem, params["vec"])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if _vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        mod = mc.compile_cuda(self.source, {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                                            "ACT_FN_CODE": CODES[problem["fn"]]},
                              [n for v in vecs for n in self.names(problem, params, v)],
                              device)
        fast, safe = (self.program(mod, problem, params, v, device) for v in (vec, 1))
        return _ActBwdKernel(fast, safe, vec * dtype_size(problem["dtype"]))


@register_variant
class ActBwdStream(_ActBwdCuda):
    name = "bwd_stream"
    doc = "no bias: a grid-stride vector stream over dy and x"

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return _vec_ok(problem, params["vec"]) and params["waves"] == 4

    def names(self, problem: Problem, params: Mapping[str, Any], vec: int) -> list[str]:
        itype = mc.index_type(math.prod(problem["shape"]))
        return [f"act_bwd_stream<{params['block']},{vec},{itype}>"]

    def program(self, mod: Any, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        n = math.prod(problem["shape"])
        itype, block = mc.index_type(n), params["block"]
        nvec = n // vec
        run = mc.launch(mod, self.names(problem, params, vec)[0],
                        max(1, min(mc.cdiv(nvec, block),
                                   mc.sm_count(device) * (2048 // block) * 2)), block)
        dims = run.consts(mc.index_scalar(nvec, itype))

        def go(dy: Any, x: Any, b: Any, dx: Any, db: Any, slope: float) -> None:
            run((dy, x, dx, *dims, run.f32(slope)))

        return go


@register_variant
class ActBwdChannel(_ActBwdCuda):
    name = "bwd_channel"
    bias = "channel"
    doc = ("channel bias: channel-stationary blocks write dx and partial bias sums, then a "
           "per-channel finishing sum (dbias fused, deterministic)")

    def names(self, problem: Problem, params: Mapping[str, Any], vec: int) -> list[str]:
        kind = "planes" if problem["layout"] == "NCHW" else "rows"
        return [f"act_bwd_{kind}<{params['block']},{vec}>", "act_bwd_finish"]

    def splits(self, problem: Problem, params: Mapping[str, Any], vec: int, sms: int) -> int:
        n, inner, c = _geometry(problem)
        block, waves = params["block"], params["waves"]
        if problem["layout"] == "NCHW":
            return max(1, min(mc.cdiv(sms * waves, c), mc.cdiv(n // c // vec, block), 65535))
        tx = min(c // vec, block)
        return max(1, min(mc.cdiv(sms * waves, mc.cdiv(c // vec, tx)),
                          mc.cdiv(n // c, block // tx), 65535))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 4 * _geometry(problem)[2] * self.splits(problem, params, 1, 132)

    def program(self, mod: Any, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        n, inner, c = _geometry(problem)
        block = params["block"]
        s = self.splits(problem, params, vec, mc.sm_count(device))
        part = mc.workspace(device, 4 * c * s)
        if problem["layout"] == "NCHW":
            run = mc.launch(mod, f"act_bwd_planes<{block},{vec}>", (c, s), block)
            dims = run.consts(np.int64(n // (c * inner)), np.int32(c), np.int32(inner))
        else:
            tx = min(c // vec, block)
            run = mc.launch(mod, f"act_bwd_rows<{block},{vec}>", (s, mc.cdiv(c // vec, tx)),
                            block, 4 * block * vec)
            dims = run.consts(np.int64(n // c), np.int32(c))
        fin = mc.launch(mod, "act_bwd_finish", mc.cdiv(c, 128), 128)
        fdims = fin.consts(np.int32(s), np.int32(c))

        def go(dy: Any, x: Any, b: Any, dx: Any, db: Any, slope: float) -> None:
            run((dy, x, b, dx, part, *dims, run.f32(slope)))
            fin((part, *fdims, db))

        return go


# ----------------------------------------------------------------------------- numpy


@register_variant
class ActBwdNumpy(NumpyBackward):
    op = "activation"
    doc = "fp32 numpy (float64 bias sums)"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return act_backward_numpy(problem, mc.f32(inputs["dy"]), mc.f32(inputs["x"]),
                                  f32_or_none(inputs.get("bias")),
                                  float(attrs.get("negative_slope", 0.01)))


# ----------------------------------------------------------------------------- public API


def activation_backward(fn: str, dy: Any, x: Any, bias: Any = None, layout: str = "NCHW",
                        negative_slope: float = 0.01, plan: Any = None) -> Any:
    """Gradient of ``act(x [+ bias])`` for activation ``fn`` given the forward's input ``x``:
    dx, or ``(dx, dbias)`` with a per-channel ``bias`` (axis 1 for NCHW, last for NHWC)."""
    from dnnctl.ops.dispatch import bind, run

    if fn not in CODES:
        raise UsageError(f"unknown activation {fn!r}", hint=f"use one of {', '.join(CODES)}")
    bound = bind(dy, x, bias)
    ga, xa, ba = bound.arrays
    dtype = mc.float_dtype(xa, "x")
    mc.contiguous(xa, "x")
    mc.check_out(ga, tuple(xa.shape), dtype, "dy")
    layout = mc.check_layout(layout)
    key = {"fn": fn, "shape": tuple(xa.shape), "dtype": dtype,
           "bias": "none" if ba is None else "channel", "layout": layout, "pass": "backward"}
    if ba is not None:
        if xa.ndim < 2 and layout == "NCHW":
            raise UsageError("activation_backward: a NCHW channel bias needs rank >= 2",
                             hint="use layout='NHWC' for a bias on the last axis")
        mc.check_vector(ba, xa.shape[-1 if layout == "NHWC" else 1], dtype, "bias")
    res = run("activation", key, bound, ("dy", "x", "bias"),
              {"negative_slope": float(negative_slope)}, plan=plan)
    dx = bound.wrap(res["dx"])
    return dx if ba is None else (dx, bound.wrap(res["dbias"]))


def _named(fn: str) -> Any:
    def grad(dy: Any, x: Any, bias: Any = None, layout: str = "NCHW", plan: Any = None) -> Any:
        return activation_backward(fn, dy, x, bias, layout, plan=plan)

    grad.__name__ = grad.__qualname__ = f"{fn}_backward"
    grad.__doc__ = (f"Gradient of {fn}(x [+ bias]): dx, or (dx, dbias) with a channel bias "
                    "(see activation_backward).")
    return grad


relu_backward = _named("relu")
gelu_backward = _named("gelu")
gelu_tanh_backward = _named("gelu_tanh")
silu_backward = _named("silu")
sigmoid_backward = _named("sigmoid")
tanh_backward = _named("tanh")


def leaky_relu_backward(dy: Any, x: Any, negative_slope: float = 0.01, bias: Any = None,
                        layout: str = "NCHW", plan: Any = None) -> Any:
    """Gradient of leaky_relu(x [+ bias]): dx, or (dx, dbias) with a channel bias."""
    return activation_backward("leaky_relu", dy, x, bias, layout, negative_slope, plan)
