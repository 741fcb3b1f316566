"""softmax / log_softmax backward: op ``softmax`` with ``pass: backward``.

Inputs: the forward's output ``y`` and the upstream gradient ``dy`` (rows, cols); output
``dx``. softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
CUDA variants (kernels/softmax/backward.cu): ``bwd_warp_row`` (TPR threads per row, rows in
registers), ``bwd_block_row`` (a block per row, rows in registers) and ``bwd_stream`` (a block
per row, two reads; any length). CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    Variant,
    np_dtype,
)
from dnnctl.ops.dispatch import bind, run
from dnnctl.ops.passes import GRAD_TOL, BackwardSpec, f64, term_scale
from dnnctl.ops.registry import register_variant


def softmax_backward_numpy(y: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """dx of softmax (log=False) or log_softmax (log=True) from y and dy, in their precision."""
    with np.errstate(all="ignore"):
        if log:
            return dy - np.exp(y) * dy.sum(axis=-1, keepdims=True)
        return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def softmax_dx_scale(y: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """|y| (|dy| + |sum(dy y)|) (log_softmax: |dy| + |exp(y) sum(dy)|): the terms dx is the
    sum of (a row of length 1 has y = 1 (0 for log) and dx = 0 exactly)."""
    with np.errstate(all="ignore"):
        if log:
            return term_scale(dy, np.exp(y) * dy.sum(axis=-1, keepdims=True))
        return np.abs(y) * term_scale(dy, (dy * y).sum(axis=-1, keepdims=True))


class SoftmaxBackward(BackwardSpec):
    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        spec = TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])
        return {"y": spec, "dy": spec}

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        return {"dx": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape, dt = (problem["rows"], problem["cols"]), np_dtype(problem["dtype"])
        x = rng.standard_normal(shape) * 3
        with np.errstate(all="ignore"):
            m = x.max(axis=-1, keepdims=True)
            z = x - m
            s = np.log(np.exp(z).sum(axis=-1, keepdims=True))
            y = z - s if problem["log"] else np.exp(z - s)
        return {"y": y.astype(dt), "dy": rng.standard_normal(shape).astype(dt)}

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": softmax_backward_numpy(up["y"], up["dy"], problem["log"])}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": softmax_dx_scale(up["y"], up["dy"], problem["log"])}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]]

    def flops(self, op: Op, problem: Problem) -> float:
        return 4.0 * problem["rows"] * problem["cols"]

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("bwd_numpy")
        cols, dtype = problem["cols"], problem["dtype"]
        vec = max(v for v in mc.VECS if mc.vec_fits(dtype, v) and cols % v == 0)
        from dnnctl.ops.registry import get_variant

        cands = [("bwd_warp_row", {"block": 128, "vec": vec,
                                   "tpr": min(32, mr.next_pow2(mc.cdiv(cols, vec * 4)))}),
                 ("bwd_block_row", {"block": min(1024, max(128, mr.next_pow2(
                     mc.cdiv(cols, vec * 4)))), "vec": vec})]
        for name, params in cands:
            v = get_variant("softmax", "cupy", name)
            if v.supports(problem, device) and v.valid_params(problem, params, device):
                return Choice.of(name, params)
        return Choice.of("bwd_stream", {"block": 1024 if cols >= 8192 else 256, "vec": vec})


SOFTMAX_BACKWARD = SoftmaxBackward()


# ----------------------------------------------------------------------------- CUDA


class _SoftmaxBwdCuda(mr.RowVariant):
    op = "softmax"
    passes = ("backward",)
    source = "softmax/backward.cu"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "LOG": int(problem["log"])}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["y"], inputs["dy"], outputs["dx"])


@register_variant
class SoftmaxBwdWarpRow(mr.WarpRowMixin, _SoftmaxBwdCuda):
    name = "bwd_warp_row"
    kernel = "softmax_bwd_warp"
    MAX_ELEMS = 32  # two rows (y, dy) in registers
    doc = "tpr threads per row (shuffles only), y and dy rows in registers; cols <= 1024"


@register_variant
class SoftmaxBwdBlockRow(mr.BlockRowMixin, _SoftmaxBwdCuda):
    name = "bwd_block_row"
    kernel = "softmax_bwd_block"
    MAX_COLS = 8192
    doc = "a block per row, y and dy rows in registers; cols <= 8192"

    @staticmethod
    def cap(block: int) -> int:
        return 8 if block == 1024 else 16  # floats per thread, per row (two rows)


@register_variant
class SoftmaxBwdStream(mr.OnlineMixin, _SoftmaxBwdCuda):
    name = "bwd_stream"
    kernel = "softmax_bwd_stream"
    doc = "a block per row, two reads of y and dy (dot product, then dx); any length"


# ----------------------------------------------------------------------------- numpy


@register_variant
class SoftmaxBwdNumpy(Variant):
    op = "softmax"
    backend = "numpy"
    name = "bwd_numpy"
    passes = ("backward",)
    doc = "fp32 numpy over cache-sized blocks of rows"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log, rows = problem["log"], problem["rows"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            y, dy, dx = inputs["y"], inputs["dy"], outputs["dx"]
            for r in range(0, rows, 256):
                mc.put(dx[r:r + 256], softmax_backward_numpy(mc.f32(y[r:r + 256]),
                                                             mc.f32(dy[r:r + 256]), log))

        return kernel


# ----------------------------------------------------------------------------- public API


def softmax_backward(y: Any, dy: Any, axis: int = -1, log: bool = False,
                     plan: Any = None) -> Any:
    """Gradient of :func:`softmax` (``log=True``: of :func:`log_softmax`) given its output
    ``y`` and the gradient ``dy`` of the loss with respect to ``y``; returns dx."""
    bound = bind(y, dy)
    ya, ga = bound.arrays
    dtype = mc.float_dtype(ya, "y")
    shape = tuple(ya.shape)
    if not shape or 0 in shape:
        raise ShapeError(f"softmax_backward: y has shape {shape}, expected at least one "
                         "dimension and no zero-size axis")
    mc.check_out(ga, shape, dtype, "dy")
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ShapeError(f"softmax_backward: axis {axis} is out of range for rank {rank}")
    axis %= rank
    xp = bound.backend.xp
    if axis != rank - 1:  # kernels reduce contiguous rows: move the axis last (copies)
        ya = xp.ascontiguousarray(xp.moveaxis(ya, axis, -1))
        ga = xp.ascontiguousarray(xp.moveaxis(ga, axis, -1))
    mc.contiguous(ya, "y")
    mc.contiguous(ga, "dy")
    cols = ya.shape[-1]
    key = {"rows": ya.size // cols, "cols": cols, "dtype": dtype, "log": bool(log),
           "pass": "backward"}
    flat = bound.__class__(bound.backend, bound.device,
                           [ya.reshape(-1, cols), ga.reshape(-1, cols)], bound.wrap)
    dx = run("softmax", key, flat, ("y", "dy"), {}, plan=plan)["dx"].reshape(ya.shape)
    if axis != rank - 1:
        dx = xp.ascontiguousarray(xp.moveaxis(dx, -1, axis))
    return bound.wrap(dx)


def log_softmax_backward(y: Any, dy: Any, axis: int = -1, plan: Any = None) -> Any:
    """Gradient of :func:`log_softmax` given its output ``y`` and ``dy``; returns dx."""
    return softmax_backward(y, dy, axis, True, plan)
