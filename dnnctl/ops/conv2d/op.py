"""The conv2d op: key schema, float64 reference, tolerances, counts and default heuristic.

Key (docs/ops.md): n, c, h, w, k, r, s, stride [2] = 1, pad [ph, pw] or [top, bottom, left,
right] = 0 (canonical: 2 values when symmetric), dilation [2] = 1, groups = 1, dtype, layout,
bias = false, activation (none, relu, gelu, silu, relu6, hardswish) = none, residual = false,
residual_before_act = false, tf32 = false.

Tensors: x NCHW (N, C, H, W) or NHWC (N, H, W, C); w NCHW (K, C/g, R, S) or NHWC (K, R, S, C/g);
bias (K,) and residual (shape of y) in the I/O dtype; y NCHW (N, K, P, Q) or NHWC (N, P, Q, K).
Epilogue order: + bias, then the activation (gelu is the erf form), then + residual; with
residual_before_act the residual goes in before the activation: act(conv + bias + residual),
a ResNet block's end (canonicalized to false without a residual or an activation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops.base import (
    DTYPES,
    Choice,
    Field,
    Op,
    Problem,
    TensorSpec,
    Variant,
    first_choice,
    np_dtype,
)
from dnnctl.ops.conv2d import backward
from dnnctl.ops.conv2d.geom import (  # noqa: F401 - re-exported: the op's vocabulary
    ACTIVATIONS,
    CONV_PASSES,
    LAYOUTS,
    NCHW_TRANSPOSE_FLOPS,
    ConvGeom,
    apply_activation,
    canonical_pad,
    conv_nchw,
    from_nchw,
    geometry,
    output_size,
    pad4,
    to_nchw,
)
from dnnctl.ops.costmodel import pick, variant_default
from dnnctl.ops.registry import register_op, variants

VENDOR_DEFAULT = "torch_cudnn"  # the un-tuned CUDA forward's variant where it runs


def epilogue_nchw(y: np.ndarray, g: ConvGeom, bias: np.ndarray | None,
                  residual_nchw: np.ndarray | None) -> np.ndarray:
    """+ bias, activation, + residual (or + residual before the activation) on an NCHW
    result (in y's dtype)."""
    if g.bias:
        if bias is None:
            raise UsageError("conv2d: the key says bias=true but no bias was given")
        y = y + bias.astype(y.dtype).reshape(1, g.k, 1, 1)
    if g.residual and residual_nchw is None:
        raise UsageError("conv2d: the key says residual=true but no residual was given")
    if g.residual_before_act:
        y = y + residual_nchw.astype(y.dtype)
    y = apply_activation(y, g.activation)
    if g.residual and not g.residual_before_act:
        y = y + residual_nchw.astype(y.dtype)
    return y


# ----------------------------------------------------------------------------- op


class _PadField(Field):
    """pad: 1, 2 or 4 ints (>= 0), canonicalized to 2 when symmetric."""

    def normalize(self, op: str, name: str, value: Any) -> Any:
        return canonical_pad(super().normalize(op, name, value))


@register_op
class Conv2d(Op):
    """2-D convolution forward with optional fused bias, activation and residual."""

    name = "conv2d"
    doc = "2-D convolution (cross-correlation) forward, NCHW/NHWC, groups, fused epilogue"
    fields = {
        "n": Field("int", minimum=1, doc="batch size"),
        "c": Field("int", minimum=1, doc="input channels"),
        "h": Field("int", minimum=1, doc="input height"),
        "w": Field("int", minimum=1, doc="input width"),
        "k": Field("int", minimum=1, doc="output channels"),
        "r": Field("int", minimum=1, doc="filter height"),
        "s": Field("int", minimum=1, doc="filter width"),
        "stride": Field("ints", default=(1, 1), minimum=1, length=2, doc="[sh, sw]"),
        "pad": _PadField("ints", default=(0, 0), minimum=0,
                         doc="[ph, pw] or [top, bottom, left, right]"),
        "dilation": Field("ints", default=(1, 1), minimum=1, length=2, doc="[dh, dw]"),
        "groups": Field("int", default=1, minimum=1, doc="channel groups (C for depthwise)"),
        "dtype": Field("str", choices=DTYPES, doc="I/O dtype; accumulation is fp32"),
        "layout": Field("str", choices=LAYOUTS, doc="NCHW or NHWC"),
        "bias": Field("bool", default=False),
        "activation": Field("str", default="none", choices=ACTIVATIONS),
        "residual": Field("bool", default=False),
        "residual_before_act": Field("bool", default=False,
                                     doc="act(conv + bias + residual) instead of "
                                         "act(conv + bias) + residual"),
        "tf32": Field("bool", default=False, doc="allow TF32 math for float32 (as torch does)"),
        "pass": Field("str", default="forward", choices=CONV_PASSES,
                      doc="forward, dgrad (dx from dy and w) or wgrad (dw, db from x and dy)"),
    }

    def check(self, key: dict[str, Any]) -> None:
        """C and K divisible by groups; output at least 1x1; tf32 only means something for
        float32 (it is canonicalized to false for fp16/bf16 so plan keys match)."""
        c, k, groups = key["c"], key["k"], key["groups"]
        if c % groups:
            raise UsageError(f"conv2d: c={c} is not divisible by groups={groups}",
                             hint="input channels must be a multiple of groups")
        if k % groups:
            raise UsageError(f"conv2d: k={k} is not divisible by groups={groups}",
                             hint="output channels must be a multiple of groups")
        p, q = output_size(key["h"], key["w"], key["r"], key["s"], key["stride"], key["pad"],
                           key["dilation"])
        if p < 1 or q < 1:
            raise UsageError(
                f"conv2d: output size {p}x{q} is empty (input {key['h']}x{key['w']}, filter "
                f"{key['r']}x{key['s']}, pad {list(key['pad'])}, dilation "
                f"{list(key['dilation'])})",
                hint="the dilated filter must fit in the padded input")
        if key["dtype"] != "float32":
            key["tf32"] = False
        if not key["residual"] or key["activation"] == "none":
            key["residual_before_act"] = False  # the same sum either way
        if key.get("pass", "forward") != "forward":
            _bwd().check(key)

    # -- tensors
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        g = geometry(problem)
        if g.pass_ != "forward":
            return _bwd().input_specs(g)
        specs = {"x": TensorSpec(g.x_shape(), g.dtype), "w": TensorSpec(g.w_shape(), g.dtype)}
        if g.bias:
            specs["bias"] = TensorSpec((g.k,), g.dtype)
        if g.residual:
            specs["residual"] = TensorSpec(g.y_shape(), g.dtype)
        return specs

    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        g = geometry(problem)
        if g.pass_ != "forward":
            return _bwd().output_specs(g)
        return {"y": TensorSpec(g.y_shape(), g.dtype)}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Normal x and residual, weights scaled by 1/sqrt(C/g*R*S) so y stays O(1)."""
        g = geometry(problem)
        if g.pass_ != "forward":
            return _bwd().make_inputs(g, rng)
        dt = np_dtype(g.dtype)
        out = {"x": rng.standard_normal(g.x_shape(), dtype=np.float32).astype(dt)}
        scale = 1.0 / math.sqrt(g.crs)
        out["w"] = (rng.standard_normal(g.w_shape(), dtype=np.float32) * scale).astype(dt)
        if g.bias:
            out["bias"] = (rng.standard_normal((g.k,), dtype=np.float32) * 0.5).astype(dt)
        if g.residual:
            out["residual"] = rng.standard_normal(g.y_shape(), dtype=np.float32).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """float64 convolution + epilogue (or the gradients), in the problem's layout."""
        g = geometry(problem)
        if g.pass_ != "forward":
            return _bwd().reference(problem, inputs)
        x = to_nchw(np.asarray(inputs["x"], dtype=np.float64), g.layout)
        w = to_nchw(np.asarray(inputs["w"], dtype=np.float64), g.layout)
        y = conv_nchw(np.ascontiguousarray(x), np.ascontiguousarray(w), g)
        res = inputs.get("residual")
        res = None if res is None else to_nchw(np.asarray(res, dtype=np.float64), g.layout)
        bias = inputs.get("bias")
        bias = None if bias is None else np.asarray(bias, dtype=np.float64)
        y = epilogue_nchw(y, g, bias, res)
        return {"y": np.ascontiguousarray(from_nchw(y, g.layout))}

    def tolerance(self, problem: Problem, output: str) -> float:
        """‖out − ref‖/‖ref‖: fp32 1e-5, tf32 1e-3 (10-bit mantissa inputs: ~3e-4 rounded,
        ~8e-4 truncated), fp16 2e-3, bf16 8e-3 (output rounding alone is ~3e-4 / ~2e-3)."""
        if problem.get("pass", "forward") != "forward":
            return _bwd().tolerance(problem, output)
        dtype = problem["dtype"]
        if dtype == "float32":
            return 1e-3 if problem["tf32"] else 1e-5
        return {"float16": 2e-3, "bfloat16": 8e-3}[dtype]

    # -- roofline
    def flops(self, problem: Problem) -> float:
        g = geometry(problem)
        return 2.0 * g.n * g.k * g.p * g.q * g.crs

    # -- heuristic
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        """CUDA forward of a conv + ReLU (bias or not, no residual) in fp16 / bf16 NHWC:
        cuDNN through torch (``torch_cudnn``) wherever torch with CUDA is importable, fused
        with the bias and ReLU (fuse=1) where the call is long enough to hide the fused
        graph's host time, else cuDNN's convolution + dnnctl's epilogue pass (fuse=0; see
        cost.cudnn_fused_pays); everything else :func:`own_choice`.

        Measured on the H100 (tools/conv_probe.py, the 12 ReLU conv layers of ResNet-50 at
        batch 32, fp16 NHWC, benchmarks/RESULTS.md): cuDNN's fused graph ran 1.3-2.4x faster
        on the GPU than our cost model's pick on every one of them, and within rounding of
        torch's result through this variant; patched ResNet-50 on the H200 spent 0.6x
        eager's GPU time with it, but its host time (64 us per fused call) made the
        forward host-bound. A ResNet block's end, relu(conv + bias + residual), takes
        cuDNN's conv + add + ReLU graph where that graph's host time is hidden the same way
        (fuse=1 only: a tuned ResNet-50 at batch 32 picked it over every other candidate on
        most residual convs, 1.06-1.8x the runner-up on the GPU, benchmarks/RESULTS.md),
        else our own kernels. Every other dense convolution (not depthwise) takes cuDNN's
        convolution, then dnnctl's one-pass epilogue for what is fused (fuse=0: a bias, an
        activation, a residual), except a TF32 NCHW 1x1 one, a GEMM our ``gemm_1x1`` runs
        with the epilogue fused (:func:`_tf32_nchw_gemm`): on the unseen real-model
        convolutions of issue 14 our dense kernels reached 0.60-0.94x cuDNN tuned on 12 of 14
        (H200 and H100 runs, benchmarks/RESULTS.md), and the cost model's pick less. With nothing fused (every
        conv of a model in training mode, where BatchNorm cannot fold) a patched model's
        call runs as torch's own F.conv2d (dnnctl.torch.kernels.torch_runs). Depthwise
        convolutions keep our own kernels, which ran 1.1-2.3x torch on three of the four
        unseen ones. The tuner times ``torch_cudnn`` on every problem, so a tuned plan takes
        cuDNN wherever it is fastest and ours elsewhere."""
        if backend != "numpy" and _cudnn_gradient_default(problem):
            vendor = next((v for v in variants(self.name, backend)
                           if v.name == f"{problem['pass']}_{VENDOR_DEFAULT}"), None)
            if vendor is not None and vendor.supports(problem, device):
                return Choice.of(vendor.name, {})
        kind = _cudnn_default(problem)
        if backend != "numpy" and kind is not None:
            # variants(), not get_variant(): under use_deterministic it leaves cuDNN out
            vendor = next((v for v in variants(self.name, backend)
                           if v.name == VENDOR_DEFAULT), None)
            if vendor is not None and vendor.supports(problem, device):
                from dnnctl.ops.conv2d import cost

                params = {"fuse": 0 if kind in ("plain", "epilogue")
                          else int(cost.cudnn_fused_pays(problem, device))}
                # a block's end takes cuDNN's fused graph only (fuse=0 would be cuDNN's
                # convolution + a separate pass): else our kernels
                if ((kind != "block_end" or params["fuse"])
                        and vendor.valid_params(problem, params, device)):
                    return Choice.of(vendor.name, params)
        return own_choice(problem, backend, device)


def _cudnn_gradient_default(problem: Problem) -> bool:
    """Whether an un-tuned data / weight gradient takes cuDNN through torch
    (``dgrad_torch_cudnn`` / ``wgrad_torch_cudnn``), where it runs and determinism allows.

    Measured on the H100 (benchmarks/RESULTS.md): cuDNN's weight gradient was faster than
    every one of our wgrad kernels on all 12 ResNet-50 / ViT-B/16 layers of
    bench_conv_backward --quick (our default's pick 0.06-0.82x cuDNN). On the 22 data
    gradients of ResNet-50 at batch 64, fp16 NHWC, cuDNN as autograd calls it took 1.76 ms in
    all against our default's 3.76 ms: ours lost 1.8-8.1x on every 3x3 and strided layer and
    matched it (0.99-1.17x) on the 1x1 stride-1 ones, one GEMM (ours also won those in fp32
    NCHW). So: a dense layer's gradients to cuDNN, except the data gradient of a 1x1 stride-1
    unpadded layer. Depthwise layers keep our own kernels (as the forward's)."""
    which = problem.get("pass", "forward")
    if which == "forward" or problem["groups"] == problem["c"] > 1:
        return False
    if which == "wgrad":
        return True
    return not geometry(problem).identity


def _cudnn_default(problem: Problem) -> str | None:
    """Which un-tuned cuDNN route a forward convolution takes, None for our own kernels (a
    depthwise convolution, a backward pass). Dense ones: for an fp16 / bf16 NHWC conv + ReLU
    "relu" (no residual: cuDNN's fused conv + bias + ReLU, or its convolution + our
    epilogue, by cost.cudnn_fused_pays) or "block_end" (relu(conv + bias + residual):
    cuDNN's conv + add + ReLU graph where it pays, else None); "plain" where nothing is fused
    (cuDNN's convolution alone, any dtype and layout); "epilogue" for every other fusion
    (cuDNN's convolution, then dnnctl's one-pass epilogue), but None for a TF32 NCHW 1x1
    GEMM with an epilogue (:func:`_tf32_nchw_gemm`: ours fuses it)."""
    if problem.get("pass", "forward") != "forward" or problem["groups"] == problem["c"] > 1:
        return None
    if problem["activation"] == "none" and not problem["bias"] and not problem["residual"]:
        return "plain"
    if _tf32_nchw_gemm(problem):
        return None
    if (problem["activation"] != "relu" or problem["layout"] != "NHWC"
            or problem["dtype"] not in ("float16", "bfloat16")):
        return "epilogue"
    if not problem["residual"]:
        return "relu"
    return "block_end" if problem.get("residual_before_act") else "epilogue"


def _tf32_nchw_gemm(problem: Problem) -> bool:
    """A float32 (TF32) NCHW dense 1x1 stride-1 unpadded convolution with an epilogue: one
    GEMM per image on the NCHW tensors as they are (W[K, C] x X[C, H*W]), which our
    ``gemm_1x1`` runs with the epilogue fused and no layout change, where cuDNN's route is
    its convolution plus a separate epilogue pass. On the H200 (benchmarks/RESULTS.md, the
    unseen list of issue 14, two runs) the tuned pick of all four such convolutions
    (EfficientNet-B0, ConvNeXt-T, YOLOv8-s, 7x7 to 80x80, 40 to 672 channels) was
    ``gemm_1x1``, 6-18% faster than cuDNN + epilogue; the cost model's own pick matched the
    tuned parameters on three of the four."""
    return (problem["dtype"] == "float32" and bool(problem["tf32"])
            and problem["layout"] == "NCHW" and problem["groups"] == 1
            and geometry(problem).identity)


def own_choice(problem: Problem, backend: str, device: Any) -> Choice:
    """dnnctl's own kernels only: the cheapest candidate by the cost model
    (dnnctl/ops/conv2d/cost.py) on CUDA; near-ties (within TIE) go to the earlier variant of
    preference(). The numpy backend, the backward passes and variants without a cost
    function use preference(). What the benchmarks hold against cuDNN as "our heuristic"."""
    if backend != "numpy" and problem.get("pass", "forward") == "forward":
        best = pick(ranked(problem, backend, device), preference(problem, backend))
        if best is not None:
            return Choice.of(best.variant, best.params)
    table = {v.name: v for v in variants("conv2d", backend) if not v.vendor}
    # then anything that runs: it beats an error
    return first_choice(table, [*preference(problem, backend), *table], problem, backend,
                        device)


def ranked(problem: Problem, backend: str, device: Any) -> list[Any]:
    """The cost model's estimates for a forward problem (dnnctl.ops.costmodel.Estimate),
    cheapest first: what default_choice picks from, and what explains the pick."""
    from dnnctl.ops.conv2d import cost

    names = tuple(v.name for v in variants("conv2d", backend))
    return cost.rank_memo(problem, backend, device, names)


def default_params(variant: Variant, problem: Problem, device: Any) -> dict[str, Any] | None:
    """A variant's own default_params() if it has one, else its first valid parameters."""
    return variant_default(variant, problem, device)


def preference(problem: Problem, backend: str) -> list[str]:
    """Variant names in a fixed order: the tie-break of the cost model's near-equal
    estimates, and the whole heuristic where the model does not apply (the numpy backend,
    the backward passes, variants without a cost function).

    From the H200 measurements (benchmarks/bench_conv.py) and the arithmetic of each
    algorithm: tensor cores whenever the math allows them (fp16 / bf16, or float32 with
    tf32): gemm_1x1 for 1x1, implicit_gemm for NHWC, and for NCHW the transposes into NHWC
    (nhwc_implicit_gemm) once the convolution is big enough to repay them, since the NCHW
    patch gather loads one element at a time. Depthwise has its own memory-bound kernels.
    Exact float32 goes to cuBLAS SGEMM (im2col_gemm; winograd F(4x4) for large 3x3 stride-1
    layers, 4x fewer multiplies). direct (CUDA cores) is the fallback for what is left.
    """
    g = geometry(problem)
    if g.pass_ != "forward":
        return _bwd().preference(g, backend)
    if backend == "numpy":
        return numpy_preference(g)
    tensor_cores = g.dtype in ("float16", "bfloat16") or g.tf32
    order: list[str] = []
    if g.depthwise:
        if not g.nhwc:
            order.append("depthwise_planes")
        order.append("depthwise")
        if g.nhwc:
            order.append("depthwise_tile")
    is_1x1 = g.r == 1 and g.s == 1 and (g.pt, g.pb, g.pl, g.pr) == (0, 0, 0, 0)
    if is_1x1 and (g.groups == 1 or g.nhwc) and not g.depthwise:
        order += ["gemm_1x1"] if tensor_cores else ["im2col_gemm", "gemm_1x1"]
    if tensor_cores:
        if g.nhwc:
            order.append("implicit_gemm")
        elif 2.0 * g.npq * g.k * g.crs >= NCHW_TRANSPOSE_FLOPS:
            order += ["nhwc_implicit_gemm", "implicit_gemm"]
        else:
            order += ["implicit_gemm", "nhwc_implicit_gemm"]
    else:
        winograd_shape = (g.r == 3 and g.s == 3 and (g.sh, g.sw) == (1, 1)
                          and (g.dh, g.dw) == (1, 1) and g.groups == 1)
        if winograd_shape and g.cg >= 64 and g.kg >= 64 and g.p * g.q >= 64:
            order.append("winograd")
    if g.groups == 1 and g.crs >= 64:
        order.append("im2col_gemm")
    order.append("direct")
    return list(dict.fromkeys(order))


def numpy_preference(g: ConvGeom) -> list[str]:
    """CPU heuristic, from timings of the numpy variants (see numpy_variants.py)."""
    if g.groups > 1 and g.cg * g.kg <= 64:
        return ["direct", "im2col_gemm", "fft"]
    big_filter = g.r * g.s >= 81 and (g.sh, g.sw) == (1, 1)
    if big_filter and g.groups == 1:
        return ["fft", "im2col_gemm", "direct"]
    return ["im2col_gemm", "direct", "fft"]


def _bwd() -> Any:
    """The backward-pass half of the op (dnnctl.ops.conv2d.backward)."""
    return backward
