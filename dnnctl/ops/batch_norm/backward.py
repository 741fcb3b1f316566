"""Batch-norm backward: op ``batch_norm`` with ``pass: backward`` (key schema, float64
reference and default choice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Choice, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import term_scale
from dnnctl.ops.registry import variants


def fused_relu(problem: Problem) -> bool:
    """The key fuses a ReLU (``activation: relu``)."""
    return problem.get("activation", "none") == "relu"


def epilogue_defines(problem: Problem) -> dict[str, int]:
    """The fused ReLU and residual as the kernels' defines (bn_exact.cuh, bn_backward.cu)."""
    return {"BN_ACT": int(fused_relu(problem)), "BN_RESID": int(problem.get("residual", False))}


def relu_mask(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
              mean: np.ndarray, invstd: np.ndarray, b: np.ndarray | None,
              z: np.ndarray | None = None) -> np.ndarray:
    """dy through the fused ReLU of an ``activation: relu`` key: zero where the forward's
    pre-activation (x - mean) * invstd * w + b (+ the residual z) was not positive
    (recomputed from x)."""
    if not fused_relu(problem):
        return dy
    shape = sp.channel_shape(problem)
    scale = invstd if w is None else invstd * w
    with np.errstate(all="ignore"):
        pre = (x - mean.reshape(shape)) * scale.reshape(shape)
        if b is not None:
            pre = pre + b.reshape(shape)
        if z is not None:
            pre = pre + z
    return np.where(pre > 0, dy, np.zeros((), dy.dtype))


def bn_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                      mean: np.ndarray, invstd: np.ndarray, b: np.ndarray | None = None,
                      z: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of batch_norm training (of relu(batch_norm) with ``activation:
    relu``, b the forward's bias; of relu(batch_norm + z) with ``residual``, and dresidual)
    in the inputs' precision (sums in float64)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    dy = relu_mask(problem, dy, x, w, mean, invstd, b, z)
    extra = {"dresidual": dy} if problem.get("residual") else {}
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64)
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64)
        scale = invstd if w is None else invstd * w
        dx = scale.reshape(shape) * (dy - (sdy / count).reshape(shape)
                                     - xh * (sdx / count).reshape(shape))
    return {"dx": dx, "dweight": sdx, "dbias": sdy, **extra}


def bn_dx_scale(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                mean: np.ndarray, invstd: np.ndarray, b: np.ndarray | None = None,
                z: np.ndarray | None = None) -> np.ndarray:
    """|invstd w| (|dy| + |mean(dy)| + |xhat mean(dy xhat)|): the terms dx is the sum of (two
    elements per channel give xhat = +-1 and dx ~ 0 from terms of size invstd |dy|)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    dy = relu_mask(problem, dy, x, w, mean, invstd, b, z)
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64) / count
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64) / count
        a = np.abs(invstd if w is None else invstd * w).reshape(shape)
        return a * term_scale(dy, sdy.reshape(shape), xh * sdx.reshape(shape))


class BatchNormBackward(sp.SpatialNormBackward):
    stats = ("save_mean", "save_invstd")
    x_offset = 0.7
    numpy = staticmethod(bn_backward_numpy)
    dx_scale = staticmethod(bn_dx_scale)

    def check(self, op: Op, key: dict[str, Any]) -> None:
        if not key["training"]:
            raise UsageError("batch_norm: the backward pass is of training mode (batch "
                             "statistics)", hint="set training: true in the key")
        if key.get("residual") and key.get("activation", "none") != "relu":
            raise UsageError("batch_norm: a backward with residual needs activation: relu "
                             "(without it the residual's gradient is dy itself)",
                             hint="use the key without residual and pass dy on as is")

    def stat_shape(self, problem: Problem) -> tuple[int, ...]:
        return (problem["c"],)

    @staticmethod
    def _relu_bias(problem: Problem) -> bool:
        """The fused ReLU's mask needs the forward's bias (an affine key's)."""
        return fused_relu(problem) and problem["affine"]

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = super().input_specs(op, problem)
        if self._relu_bias(problem):
            specs["bias"] = TensorSpec((problem["c"],), "float32")
        if problem.get("residual"):
            specs["residual"] = specs["x"]
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = super().output_specs(op, problem)
        if problem.get("residual"):  # the gated dy, in the input's dtype
            specs["dresidual"] = specs["dx"]
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = super().make_inputs(op, problem, rng)
        if self._relu_bias(problem):  # about a third of the pre-activations below zero
            out["bias"] = (rng.standard_normal(problem["c"]) * 0.5).astype(np.float32)
        if problem.get("residual"):
            z = rng.standard_normal(sp.tensor_shape(problem)) * 0.5
            out["residual"] = z.astype(np_dtype(problem["dtype"]))
        return out

    def _args(self, inputs: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
        return (*super()._args(inputs), inputs.get("bias"), inputs.get("residual"))

    def saved_stats(self, problem: Problem, x: np.ndarray,
                    eps: float) -> tuple[np.ndarray, np.ndarray]:
        """(mean, invstd) per channel, float64."""
        axes, xf = sp.reduce_axes(problem), x.astype(np.float64)
        mean = xf.mean(axis=axes)
        var = np.square(xf - mean.reshape(sp.channel_shape(problem))).mean(axis=axes)
        return mean, 1.0 / np.sqrt(var + eps)

    def flops(self, op: Op, problem: Problem) -> float:
        return 7.0 * sp.numel(problem)

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        """torch's own backward (``bwd_torch``: cuDNN's, where torch picks it) for a plain
        affine key, where torch with CUDA runs and determinism allows; dnnctl's
        ``bwd_reduce_dx`` for the rest (the fused ReLU and residual keys, which only ours
        take). On the six ResNet-50 shapes at batch 64, fp16 NHWC (H100,
        benchmarks/RESULTS.md, GPU time), cuDNN's semi-persistent backward beat our two-pass
        kernel on five (ours 0.79-0.90x), ours won one (1.09x at 28x28x512); with the fused
        ReLU ours won four of six (1.01-1.26x against torch's threshold + batch_norm
        backward). The tuner times both, so a tuned plan takes each where it is faster.
        ``bwd_persist`` (one cooperative launch, dy and x read once) is a tuner candidate,
        not the default: on the H100 (2026-12-07, GPU time, plain keys) it took 34.7 us
        against our two-pass 45.5 at 28x28x128 and 31.3 against cuDNN's 36.8 at 7x7x2048,
        but a patched ResNet-50 training step that ran the persistent kernels by default
        took 44.5 ms in eager mode against 32.0 without them (its CUDA-graph replay did not
        change), which was not explained before the device time ran out (a cooperative
        launch that waits for the GPU would do it). A plan tuned on wall time takes it
        only where a call, host included, is faster."""
        if not fused_relu(problem) and not problem.get("residual") and problem["affine"]:
            vendor = next((v for v in variants(op.name, "cupy") if v.name == "bwd_torch"),
                          None)  # variants(): under use_deterministic it is left out
            if vendor is not None and vendor.supports(problem, device):
                return Choice.of(vendor.name, {})
        return Choice.of("bwd_reduce_dx", {"block": 256, "vec": sp.best_vec(problem),
                                           "waves": 4, "tile": 128, "unroll": 1, "rev": 0})


BATCH_NORM_BACKWARD = BatchNormBackward()


