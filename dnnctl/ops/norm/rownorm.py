"""layer_norm and rms_norm over the last axis (rows x cols), optional weight / bias.

Op keys ``layer_norm`` (rows, cols, dtype, weight, bias) and ``rms_norm`` (rows, cols, dtype,
weight). CUDA variants (kernels/norm/, shared by both ops through ``-DRMS``): ``warp_row``,
``block_row`` (row in registers, exact two-pass statistics), ``block_smem`` (row staged in
shared memory) and ``welford`` (single-pass statistics, second read; any length). CPU
variants: ``numpy_whole`` and ``numpy_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
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
    np_dtype,
)
from dnnctl.ops.dispatch import CallSpec, Parsed, call
from dnnctl.ops.norm.backward import LAYER_NORM_BACKWARD, RMS_NORM_BACKWARD
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op, register_variant


def rownorm_numpy(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float,
                  rms: bool) -> np.ndarray:
    """layer_norm / rms_norm of the rows of ``x`` in x's precision."""
    with np.errstate(all="ignore"):
        if rms:
            y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        else:
            mean = x.mean(axis=-1, keepdims=True)
            d = x - mean
            y = d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)
        if w is not None:
            y = y * w
        if b is not None:
            y = y + b
    return y


class _RowNormOp(Op):
    rms = False

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        rows, cols, dt = problem["rows"], problem["cols"], problem["dtype"]
        specs = {"x": TensorSpec((rows, cols), dt)}
        if problem["weight"]:
            specs["weight"] = TensorSpec((cols,), dt)
        if problem.get("bias", False):
            specs["bias"] = TensorSpec((cols,), dt)
        return specs

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["rows"], problem["cols"]), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt = np_dtype(problem["dtype"])
        out = {}
        for name, spec in self.input_specs(problem).items():
            v = rng.standard_normal(spec.shape, dtype=np.float32)
            out[name] = (v * 2 + 0.5 if name == "x" else v).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        eps = float(attrs.get("eps", self.attrs["eps"]))
        return {"y": rownorm_numpy(up["x"], up.get("weight"), up.get("bias"), eps, self.rms)}

    def tolerance(self, problem: Problem, output: str) -> float:
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[problem["dtype"]]

    def flops(self, problem: Problem) -> float:
        return 7.0 * problem["rows"] * problem["cols"]

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_rows", {"chunk_rows": 256})
        return mr.default_row_choice(problem, device, self.name, online="welford")


@register_op
@with_backward(LAYER_NORM_BACKWARD)
class LayerNormOp(_RowNormOp):
    name = "layer_norm"
    doc = "(x - mean) / sqrt(var + eps) * weight + bias over the last axis"
    fields = {
        "rows": Field("int", minimum=1, doc="product of all but the last axis"),
        "cols": Field("int", minimum=1, doc="normalized (last) axis length"),
        "dtype": Field("str", choices=DTYPES),
        "weight": Field("bool", True),
        "bias": Field("bool", True),
        "pass": PASS_FIELD,
    }
    attrs = {"eps": 1e-5}


@register_op
@with_backward(RMS_NORM_BACKWARD)
class RmsNormOp(_RowNormOp):
    name = "rms_norm"
    doc = "x / sqrt(mean(x^2) + eps) * weight over the last axis"
    rms = True
    fields = {
        "rows": Field("int", minimum=1, doc="product of all but the last axis"),
        "cols": Field("int", minimum=1, doc="normalized (last) axis length"),
        "dtype": Field("str", choices=DTYPES),
        "weight": Field("bool", True),
        "pass": PASS_FIELD,
    }
    attrs = {"eps": 1e-6}


# ----------------------------------------------------------------------------- CUDA


class _NormCuda(mr.RowVariant):
    rms = False

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "RMS": int(self.rms),
                "HAS_W": int(problem["weight"]), "HAS_B": int(problem.get("bias", False))}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["x"], inputs.get("weight"), inputs.get("bias"), outputs["y"])

    def scalars(self, attrs: Mapping[str, Any], run: mc.Launch | None = None) -> tuple:
        eps = attrs.get("eps", 1e-6 if self.rms else 1e-5)
        return (np.float32(eps),) if run is None else (run.f32(eps),)


_STRATEGIES = (
    ("warp_row", mr.WarpRowMixin, "norm_warp",
     "tpr threads per row (shuffles only), row in registers; cols <= 2048"),
    ("block_row", mr.BlockRowMixin, "norm_block",
     "a block per row, row in registers, exact two-pass statistics; cols <= 16384"),
    ("block_smem", mr.BlockSmemMixin, "norm_smem",
     "a block per row staged in shared memory; cols * itemsize <= opt-in shared memory"),
    ("async_smem", mr.AsyncSmemMixin, "norm_async",
     "a block per row staged in shared memory by cp.async (all copies in flight at once)"),
    ("welford", mr.OnlineMixin, "norm_welford",
     "a block per row, single-pass Welford statistics, second read normalizes; any length"),
)

for _op in ("layer_norm", "rms_norm"):
    for _name, _mixin, _kernel, _doc in _STRATEGIES:
        register_variant(type(
            f"{''.join(p.title() for p in _op.split('_'))}{_name.title().replace('_', '')}",
            (_mixin, _NormCuda),
            {"op": _op, "name": _name, "source": f"norm/{_name}.cu", "kernel": _kernel,
             "doc": _doc, "rms": _op == "rms_norm", "__module__": __name__}))


class _NormSplit(mr.SplitRowMixin, _NormCuda):
    """Few, very long rows: chunks of a row on separate blocks (two launches)."""

    partial_bytes = 12  # Welford (count, mean, m2) per row chunk
    any_length = "welford"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        rows, cols = problem["rows"], problem["cols"]
        block, chunk = params["block"], params["chunk"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        splits = mc.cdiv(cols, chunk)
        names = [f"norm_split_{k}<{block},{v}>" for k in ("stats", "apply")
                 for v in dict.fromkeys((vec, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        part = mc.workspace(device, self.workspace_bytes(problem, params))
        scalars = self.scalars

        def program(v: int) -> mr.Program:
            stats = mc.launch(mod, f"norm_split_stats<{block},{v}>", (splits, rows), block)
            apply = mc.launch(mod, f"norm_split_apply<{block},{v}>", (splits, rows), block)
            dims = stats.consts(np.int32(rows), np.int32(cols), np.int32(chunk))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                x, w, b, y = arrs
                stats((x, part, *dims))
                apply((x, part, w, b, y, *dims, *scalars(attrs, apply)))

            return go

        return mr.RowKernel(program(vec), program(1), vec * mc.dtype_size(problem["dtype"]),
                            self.arrays)


for _op in ("layer_norm", "rms_norm"):
    register_variant(type(
        f"{''.join(p.title() for p in _op.split('_'))}SplitRow", (_NormSplit,),
        {"op": _op, "name": "split_row", "source": "norm/split_row.cu",
         "doc": "few long rows: chunks of a row on separate blocks, partial Welford, apply",
         "rms": _op == "rms_norm", "__module__": __name__}))


# ----------------------------------------------------------------------------- numpy


class _NormNumpy(Variant):
    backend = "numpy"
    rms = False

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        step = params.get("chunk_rows", problem["rows"])
        rms = self.rms

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            w = None if "weight" not in inputs else mc.f32(inputs["weight"])
            b = None if "bias" not in inputs else mc.f32(inputs["bias"])
            eps = float(attrs.get("eps", 1e-6 if rms else 1e-5))
            for r in range(0, x.shape[0], step):
                mc.put(y[r:r + step], rownorm_numpy(mc.f32(x[r:r + step]), w, b, eps, rms))

        return kernel


for _op in ("layer_norm", "rms_norm"):
    _title = "".join(p.title() for p in _op.split("_"))
    register_variant(type(f"{_title}NumpyWhole", (_NormNumpy,), {
        "op": _op, "name": "numpy_whole", "doc": "whole-tensor fp32 numpy",
        "rms": _op == "rms_norm", "__module__": __name__}))
    register_variant(type(f"{_title}NumpyRows", (_NormNumpy,), {
        "op": _op, "name": "numpy_rows", "doc": "fp32 numpy over cache-sized blocks of rows",
        "params": {"chunk_rows": (16, 256, 4096)}, "rms": _op == "rms_norm",
        "__module__": __name__}))


# ----------------------------------------------------------------------------- public API


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, w, b, out = arrays
    op, eps = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    shape = tuple(x.shape)
    if not shape or 0 in shape:
        raise ShapeError(f"{op}: x has shape {shape}, expected at least one dimension and no "
                         "zero-size axis")
    cols = shape[-1]
    mc.check_vector(w, cols, dtype, "weight")
    mc.check_vector(b, cols, dtype, "bias")
    mc.check_out(out, shape, dtype)
    rows = x.size // cols
    key: dict[str, Any] = {"rows": rows, "cols": cols, "dtype": dtype, "weight": w is not None}
    inputs: tuple[tuple[str, int, Any], ...] = (("x", 0, None), ("weight", 1, None))
    if op == "layer_norm":
        key["bias"] = b is not None
        inputs += (("bias", 2, None),)
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0)}
    views = {"x": (rows, cols), "y": (rows, cols)}
    if out is not None:
        return Parsed(op, key, inputs, (), (("y", 3),), attrs, result=3, kernel_shapes=views)
    return Parsed(op, key, inputs, (("y", shape, x.dtype),), (), attrs, kernel_shapes=views,
                  like={"y": 0})


_ROWNORM = CallSpec("rownorm", _parse)


def _rownorm(op: str, x: Any, weight: Any, bias: Any, eps: float, out: Any, plan: Any) -> Any:
    return call(_ROWNORM, (x, weight, bias, out), (op, eps), plan)


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               plan: Any = None, *, out: Any = None) -> Any:
    """Layer normalization over the last axis; ``weight`` / ``bias`` (cols,) in x's dtype."""
    return _rownorm("layer_norm", x, weight, bias, eps, out, plan)


def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6, plan: Any = None, *,
             out: Any = None) -> Any:
    """RMS normalization over the last axis; ``weight`` (cols,) in x's dtype."""
    return _rownorm("rms_norm", x, weight, None, eps, out, plan)
