"""batch_norm forward: inference (running statistics) and training (batch statistics, running
statistics updated with momentum and the unbiased variance, saved mean / inverse std).

Op key ``batch_norm``: n, c, h, w, dtype, layout, training, affine. Parameters and statistics
are fp32 (C,). CUDA variants (kernels/norm/): inference ``infer_flat`` (grid-stride vector
stream, per-block parameter table in shared memory) and ``infer_channel`` (channel-stationary:
NCHW block per plane, NHWC threads pinned to channels); training ``train_fused`` (one
reduction pass: shifted sums -> Welford / Chan) and ``train_two_pass`` (mean pass, then a
centered sum-of-squares pass); ``infer_exact`` and ``train_stream`` (exact-grid vector streams)
are in bn_exact.py. CPU variants: ``numpy_two_pass`` and ``numpy_one_pass``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
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
from dnnctl.ops.norm import _spatial as sp
from dnnctl.ops.norm.bn_backward import BATCH_NORM_BACKWARD
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op, register_variant

STATS = ("new_running_mean", "new_running_var", "save_mean", "save_invstd")


def bn_numpy(problem: Problem, x: np.ndarray, ins: Mapping[str, np.ndarray], eps: float,
             momentum: float, one_pass: bool = False) -> dict[str, np.ndarray]:
    """batch_norm in numpy; statistics accumulate in float64, the output in x's precision."""
    axes = sp.reduce_axes(problem)
    shape = sp.channel_shape(problem)
    c = problem["c"]
    w = ins["weight"] if problem["affine"] else np.ones(c)
    b = ins["bias"] if problem["affine"] else np.zeros(c)
    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        if problem["training"]:
            count = x.size // c
            if one_pass:
                s1 = x.sum(axis=axes, dtype=np.float64)
                s2 = np.square(x, dtype=np.float64).sum(axis=axes)
                mean = s1 / count
                var = np.maximum(s2 / count - mean * mean, 0.0)
            else:
                mean = x.mean(axis=axes, dtype=np.float64)
                var = np.square(x - mean.reshape(shape).astype(x.dtype), dtype=np.float64).mean(
                    axis=axes)
            invstd = 1.0 / np.sqrt(var + eps)
            out["save_mean"], out["save_invstd"] = mean, invstd
            out["new_running_mean"] = (1 - momentum) * ins["running_mean"] + momentum * mean
            out["new_running_var"] = ((1 - momentum) * ins["running_var"]
                                      + momentum * var * count / (count - 1))
        else:
            mean = ins["running_mean"]
            invstd = 1.0 / np.sqrt(ins["running_var"] + eps)
        scale = (invstd * w).astype(x.dtype).reshape(shape)
        out["y"] = (x - mean.astype(x.dtype).reshape(shape)) * scale + b.astype(
            x.dtype).reshape(shape)
    return out


@register_op
@with_backward(BATCH_NORM_BACKWARD)
class BatchNormOp(Op):
    name = "batch_norm"
    doc = "batch normalization forward (inference or training), NCHW or NHWC"
    fields = {**sp.SPATIAL_FIELDS, "dtype": Field("str", choices=DTYPES),
              "layout": Field("str", "NCHW", choices=("NCHW", "NHWC")),
              "training": Field("bool", False), "affine": Field("bool", True),
              "pass": PASS_FIELD}
    attrs = {"eps": 1e-5, "momentum": 0.1}

    def check(self, key: dict[str, Any]) -> None:
        if key["training"] and key["n"] * key["h"] * key["w"] < 2:
            from dnnctl.errors import UsageError

            raise UsageError("batch_norm: training needs more than one value per channel "
                             f"(n*h*w = {key['n'] * key['h'] * key['w']})")

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        c = problem["c"]
        specs = {"x": TensorSpec(sp.tensor_shape(problem), problem["dtype"]),
                 "running_mean": TensorSpec((c,), "float32"),
                 "running_var": TensorSpec((c,), "float32")}
        if problem["affine"]:
            specs["weight"] = TensorSpec((c,), "float32")
            specs["bias"] = TensorSpec((c,), "float32")
        return specs

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"y": TensorSpec(sp.tensor_shape(problem), problem["dtype"])}
        if problem["training"]:
            specs.update({k: TensorSpec((problem["c"],), "float32") for k in STATS})
        return specs

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        c = problem["c"]
        x = rng.standard_normal(sp.tensor_shape(problem), dtype=np.float32) * 1.5 + 0.7
        out = {"x": x.astype(np_dtype(problem["dtype"])),
               "running_mean": rng.standard_normal(c).astype(np.float32) * 0.3,
               "running_var": rng.uniform(0.5, 2.0, c).astype(np.float32)}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(c) * 0.5 + 1.0).astype(np.float32)
            out["bias"] = (rng.standard_normal(c) * 0.2).astype(np.float32)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a = {**self.attrs, **attrs}
        up = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        return bn_numpy(problem, up["x"], up, float(a["eps"]), float(a["momentum"]))

    def tolerance(self, problem: Problem, output: str) -> float:
        if output != "y":
            return 1e-4  # fp32 statistics accumulated in fp32 over N*H*W values
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[problem["dtype"]]

    def flops(self, problem: Problem) -> float:
        return (5.0 if problem["training"] else 2.0) * sp.numel(problem)

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_two_pass")
        vec = sp.best_vec(problem)
        if problem["training"]:
            if mc.cdiv(sp.numel(problem), 128) < 2**31:
                # two launches: statistics with 4 loads in flight per thread folded by the
                # last block of each channel tile (no finalize launch), then infer_exact's
                # stream walking x backwards (L2 still holds what the statistics read last).
                # Round 2 measured train_stream (three launches, a serial per-channel
                # finalize) at 0.65x torch; bench_backward times both against torch.
                return Choice.of("train_lastblock", {"block": 256, "vec": vec, "unroll": 4,
                                                     "blocks_per_sm": 4})
            return Choice.of("train_fused", {"block": 256, "vec": vec, "waves": 4})
        if mc.cdiv(sp.numel(problem), 128) < 2**31:
            # the activation kernels' exact-grid stream with the channel from the flat index
            # (round 1: infer_channel reached 62% of copy on NHWC 32x56x56x256 fp16)
            return Choice.of("infer_exact", {"block": 256, "vec": vec, "unroll": 2})
        if problem["layout"] == "NCHW" and problem["h"] * problem["w"] < 1024:
            return Choice.of("infer_flat", {"block": 256, "vec": vec, "unroll": 2,
                                            "blocks_per_sm": 8})
        return Choice.of("infer_channel", {"block": 256, "vec": vec, "unroll": 2})


# ----------------------------------------------------------------------------- CUDA


class _BnKernel:
    """Runs ``fast`` when x and y are aligned to the vector width, else ``safe``."""

    __slots__ = ("fast", "safe", "align", "training")
    flat_io = True  # reads only data pointers: any contiguous arrays of the problem's sizes

    def __init__(self, fast: Callable, safe: Callable, align: int, training: bool) -> None:
        self.fast, self.safe, self.align, self.training = fast, safe, align, training

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        arrs = (x, y, inputs["running_mean"], inputs["running_var"], inputs.get("weight"),
                inputs.get("bias"))
        if self.training:
            arrs += (outputs["new_running_mean"], outputs["new_running_var"],
                     outputs["save_mean"], outputs["save_invstd"])
        go = self.fast if mc.aligned(self.align, x, y) else self.safe
        go(arrs, np.float32(attrs.get("eps", 1e-5)), np.float32(attrs.get("momentum", 0.1)))


class _BnCuda(Variant):
    op = "batch_norm"
    backend = "cupy"
    training = False

    def defines(self, problem: Problem, params: int) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                "AFFINE": int(problem["affine"]), "PARAMS": params,
                "LAYOUT": int(problem["layout"] == "NHWC")}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["training"] != self.training:
            return unsupported("training-mode variant" if self.training
                               else "inference variant (training=false only)")
        return SUPPORTED

    def vecs(self, problem: Problem, params: Mapping[str, Any], device: Any) -> tuple[int, ...]:
        """The vector widths a build compiles: the planned one (if valid) and 1."""
        vec = params["vec"] if self.valid_params(problem, params, device) else 1
        return tuple(dict.fromkeys((vec, 1)))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = self.vecs(problem, params, device)[0]
        fast = self.program(problem, params, vec, device)
        safe = self.program(problem, params, 1, device)
        return _BnKernel(fast, safe, vec * dtype_size(problem["dtype"]), self.training)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        raise NotImplementedError


@register_variant
class BnInferFlat(_BnCuda):
    name = "infer_flat"
    source = "norm/bn_flat.cu"
    doc = "grid-stride vector stream; channel parameters folded per block into shared memory"
    params = {"block": (256, 512), "vec": mc.VECS, "unroll": (1, 2, 4),
              "blocks_per_sm": (2, 4, 8)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if 12 * problem["c"] + 1024 > mc.smem_limit(device):
            return unsupported("too many channels for the shared-memory parameter table")
        return _BnCuda.supports(self, problem, device)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        n = sp.numel(problem)
        itype = mc.index_type(n)
        block, unroll = params["block"], params["unroll"]
        names = [f"bn_flat<{block},{v},{unroll},{itype}>"
                 for v in self.vecs(problem, params, device)]
        mod = mc.compile_cuda(self.source, self.defines(problem, 0), names, device)
        grid = max(1, min(mc.cdiv(n // vec, block * unroll),
                          mc.sm_count(device) * params["blocks_per_sm"]))
        run = mc.launch(mod, f"bn_flat<{block},{vec},{unroll},{itype}>", grid, block,
                        12 * problem["c"])
        sizes = run.consts(*(mc.index_scalar(v, itype) for v in (
            n, problem["h"] * problem["w"], problem["c"])))

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            run((*arrs[:6], *sizes, run.f32(eps)))

        return go


@register_variant
class BnInferChannel(_BnCuda):
    name = "infer_channel"
    source = "norm/bn_channel.cu"
    doc = "channel-stationary: NCHW a block per plane, NHWC threads pinned to channel vectors"
    params = {"block": (128, 256, 512), "vec": mc.VECS, "unroll": (1, 2, 4)}

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        mod = mc.compile_cuda(self.source, self.defines(problem, 0), sp.normalize_names(
            problem, params["block"], self.vecs(problem, params, device), params["unroll"]),
            device)
        run, tail = sp.normalize_launch(mod, problem, params["block"], vec, params["unroll"],
                                        device)

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            run((*arrs[:6], *tail, run.f32(eps)))

        return go


class _BnTrain(_BnCuda):
    source = "norm/bn_train.cu"
    training = True
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}
    modes: tuple[int, ...] = (0,)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        splits = sp.stats_splits(problem, params["block"], params["vec"], params["waves"], 132)
        return 4 * problem["c"] * (3 * splits + 2)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Callable:
        block, waves, c = params["block"], params["waves"], problem["c"]
        vecs = self.vecs(problem, params, device)
        kind = "planes" if problem["layout"] == "NCHW" else "rows"
        names = [f"bn_stats_{kind}<{block},{v},{m}>" for v in vecs for m in self.modes]
        names += [f"bn_finalize<{s}>" for s in self.modes]
        names += sp.normalize_names(problem, block, vecs, 2)
        mod = mc.compile_cuda(self.source, self.defines(problem, 1), names, device)
        stats, splits = sp.stats_launches(mod, problem, block, vec, waves, self.modes, device)
        ws = mc.workspace(device, 4 * c * (3 * splits + 2))
        part, ws_mean, ws_scale = ws[:3 * c * splits], ws[3 * c * splits:][:c], ws[-c:]
        fin = {s: mc.launch(mod, f"bn_finalize<{s}>", mc.cdiv(c, 128), 128) for s in self.modes}
        norm, tail = sp.normalize_launch(mod, problem, block, vec, 2, device)
        dims = norm.consts(np.int32(splits), np.int32(c))
        modes = self.modes

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv = arrs
            eps32 = norm.f32(eps)
            fin_args = (part, *dims, rm, rv, nrm, nrv, smean, sinv, w, ws_mean, ws_scale,
                        eps32, norm.f32(momentum))
            for mode in modes:  # (0,): fused; (1, 2): mean pass then centered pass
                stats[mode]((x, part, ws_mean))
                fin[mode](fin_args)
            norm((x, y, smean, ws_scale, w, b, *tail, eps32))

        return go


@register_variant
class BnTrainFused(_BnTrain):
    name = "train_fused"
    doc = "one reduction pass (shifted sums -> Welford, Chan combine), then normalize"
    modes = (0,)


@register_variant
class BnTrainTwoPass(_BnTrain):
    name = "train_two_pass"
    doc = "a mean pass, a centered sum-of-squares pass, then normalize (3 reads)"
    modes = (1, 2)


# ----------------------------------------------------------------------------- numpy


class _BnNumpy(Variant):
    op = "batch_norm"
    backend = "numpy"
    one_pass = False

    def supports(self, problem: Problem, device: Any) -> Support:
        if self.one_pass and not problem["training"]:
            return unsupported("one-pass statistics only matter in training")
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        one_pass = self.one_pass

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            res = bn_numpy(problem, mc.f32(inputs["x"]), inputs,
                           float(attrs.get("eps", 1e-5)), float(attrs.get("momentum", 0.1)),
                           one_pass)
            for k, v in res.items():
                mc.put(outputs[k], v)

        return kernel


@register_variant
class BnNumpyTwoPass(_BnNumpy):
    name = "numpy_two_pass"
    doc = "float64 mean, then centered variance; fp32 normalize"


@register_variant
class BnNumpyOnePass(_BnNumpy):
    name = "numpy_one_pass"
    doc = "training: float64 sum and sum of squares in one pass; fp32 normalize"
    one_pass = True
