"""softmax and log_softmax over the last axis (rows of 1 .. 256k+ elements).

Op key ``softmax``: rows, cols, dtype, log. CUDA variants (kernels/softmax/):
``warp_row`` (TPR threads per row, row in registers), ``block_row`` (block per row, row in
registers), ``block_smem`` (block per row staged in shared memory), ``async_smem`` (the same
staged by cp.async), ``online`` (single-pass
online max/sum, second read for the output; any length) and ``split_row`` (few long rows split
across blocks; two launches). CPU variants: ``numpy_whole`` and ``numpy_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops import make_callable
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
)
from dnnctl.ops.dispatch import CallSpec, Parsed, call
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op, register_variant
from dnnctl.ops.softmax_bwd import SOFTMAX_BACKWARD


def softmax_numpy(x: np.ndarray, log: bool) -> np.ndarray:
    """Row softmax in x's precision; NaN / +inf in a row make the row NaN (as the kernels)."""
    with np.errstate(all="ignore"):
        m = x.max(axis=-1, keepdims=True)
        z = x - m
        e = np.exp(z)
        s = e.sum(axis=-1, keepdims=True)
        return z - np.log(s) if log else e / s


@register_op
@with_backward(SOFTMAX_BACKWARD)
class SoftmaxOp(Op):
    name = "softmax"
    doc = "softmax / log_softmax over the last axis of a (rows, cols) tensor"
    fields = {
        "rows": Field("int", minimum=1, doc="product of all but the last axis"),
        "cols": Field("int", minimum=1, doc="length of the softmax axis"),
        "dtype": Field("str", choices=DTYPES),
        "log": Field("bool", False, doc="log_softmax"),
        "pass": PASS_FIELD,
    }

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (problem["rows"], problem["cols"])
        x = rng.standard_normal(shape, dtype=np.float32) * 3
        return {"x": x.astype(np_dtype(problem["dtype"]))}

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": softmax_numpy(np.asarray(inputs["x"], np.float64), problem["log"])}

    def tolerance(self, problem: Problem, output: str) -> float:
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[problem["dtype"]]

    def flops(self, problem: Problem) -> float:
        return 5.0 * problem["rows"] * problem["cols"]

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_rows", {"chunk_rows": 256})
        return mr.default_row_choice(problem, device, "softmax")


# ----------------------------------------------------------------------------- CUDA


class _SoftmaxCuda(mr.RowVariant):
    op = "softmax"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "LOG": int(problem["log"])}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["x"], outputs["y"])


@register_variant
class SoftmaxWarpRow(mr.WarpRowMixin, _SoftmaxCuda):
    name = "warp_row"
    source = "softmax/warp_row.cu"
    kernel = "softmax_warp"
    doc = "tpr threads per row (shuffles only), the row in registers; cols <= 2048"


@register_variant
class SoftmaxBlockRow(mr.BlockRowMixin, _SoftmaxCuda):
    name = "block_row"
    source = "softmax/block_row.cu"
    kernel = "softmax_block"
    doc = "a block per row, the row in registers; cols <= 16384"


@register_variant
class SoftmaxBlockSmem(mr.BlockSmemMixin, _SoftmaxCuda):
    name = "block_smem"
    source = "softmax/block_smem.cu"
    kernel = "softmax_smem"
    doc = "a block per row staged in shared memory; cols * itemsize <= opt-in shared memory"


@register_variant
class SoftmaxAsyncSmem(mr.AsyncSmemMixin, _SoftmaxCuda):
    name = "async_smem"
    source = "softmax/async_smem.cu"
    kernel = "softmax_async"
    doc = "a block per row staged in shared memory by cp.async (all copies in flight at once)"


@register_variant
class SoftmaxOnline(mr.OnlineMixin, _SoftmaxCuda):
    name = "online"
    source = "softmax/online.cu"
    kernel = "softmax_online"
    doc = "a block per row, single-pass online max/sum, second read writes; any length"


@register_variant
class SoftmaxSplitRow(mr.SplitRowMixin, _SoftmaxCuda):
    name = "split_row"
    source = "softmax/split_row.cu"
    doc = "few long rows: chunks of a row on separate blocks, partial max/sum then apply"
    partial_bytes = 8  # (max, sum) per row chunk
    any_length = "online"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        rows, cols = problem["rows"], problem["cols"]
        block, chunk = params["block"], params["chunk"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        splits = mc.cdiv(cols, chunk)
        names = [f"softmax_split_{k}<{block},{v}>" for k in ("stats", "apply")
                 for v in dict.fromkeys((vec, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        part = mc.workspace(device, self.workspace_bytes(problem, params))

        def program(v: int) -> mr.Program:
            stats = mc.launch(mod, f"softmax_split_stats<{block},{v}>", (splits, rows), block)
            apply = mc.launch(mod, f"softmax_split_apply<{block},{v}>", (splits, rows), block)
            dims = stats.consts(np.int32(rows), np.int32(cols), np.int32(chunk))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                x, y = arrs
                stats((x, part, *dims))
                apply((x, part, y, *dims))

            return go

        return mr.RowKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                            self.arrays)


# ----------------------------------------------------------------------------- numpy


@register_variant
class SoftmaxNumpyWhole(Variant):
    op = "softmax"
    backend = "numpy"
    name = "numpy_whole"
    doc = "whole-tensor fp32 numpy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log = problem["log"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            mc.put(outputs["y"], softmax_numpy(mc.f32(inputs["x"]), log))

        return kernel


@register_variant
class SoftmaxNumpyRows(Variant):
    op = "softmax"
    backend = "numpy"
    name = "numpy_rows"
    doc = "fp32 numpy over cache-sized blocks of rows"
    params = {"chunk_rows": (16, 256, 4096)}

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        log, step, rows = problem["log"], params["chunk_rows"], problem["rows"]

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            for r in range(0, rows, step):
                mc.put(y[r:r + step], softmax_numpy(mc.f32(x[r:r + step]), log))

        return kernel


# ----------------------------------------------------------------------------- public API


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, out = arrays
    axis, log = scalars
    dtype = mc.float_dtype(x, "x")
    shape = tuple(x.shape)
    if not shape or 0 in shape:
        raise ShapeError(f"softmax: x has shape {shape}, expected at least one dimension and "
                         "no zero-size axis")
    rank = len(shape)
    axis = mc.axis_index(axis, rank, "softmax: axis")
    mc.check_out(out, shape, dtype)
    rows, cols = x.size // shape[axis], shape[axis]
    key = {"rows": rows, "cols": cols, "dtype": dtype, "log": log}
    flat = {"x": (rows, cols), "y": (rows, cols)}
    given = (("y", 1),) if out is not None else ()
    outputs = () if out is not None else (("y", shape, x.dtype),)
    result: str | int = 1 if out is not None else "y"
    if axis == rank - 1:
        mc.contiguous(x, "x")
        return Parsed("softmax", key, (("x", 0, None),), outputs, given,
                      kernel_shapes=flat, result=result, like={"y": 0})

    # kernels reduce over contiguous rows: move the axis last (a copy), then back (a copy)
    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        moved = xp.ascontiguousarray(xp.moveaxis(back[0], axis, -1))
        return {"x": moved.reshape(rows, cols)}

    def finish(kouts: dict[str, Any], back: tuple[Any, ...]) -> Any:
        moved = tuple(s for i, s in enumerate(shape) if i != axis) + (cols,)
        y = xp.moveaxis(kouts["y"].reshape(moved), -1, axis)
        if back[1] is not None:
            back[1][...] = y
            return back[1]
        return xp.ascontiguousarray(y)

    return Parsed("softmax", key, (), (("y", (rows, cols), x.dtype),), (),
                  prepare=prepare, finish=finish)


_SOFTMAX = CallSpec("softmax", _parse)


def softmax(x: Any, axis: int = -1, plan: Any = None, *, out: Any = None) -> Any:
    """exp(x - max) / sum over ``axis``. Another axis than the last costs two copies."""
    return call(_SOFTMAX, (x, out), (axis, False), plan)


def log_softmax(x: Any, axis: int = -1, plan: Any = None, *, out: Any = None) -> Any:
    """x - max - log(sum(exp(x - max))) over ``axis`` (same rules as :func:`softmax`)."""
    return call(_SOFTMAX, (x, out), (axis, True), plan)


make_callable(__name__, softmax)
