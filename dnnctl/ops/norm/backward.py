"""layer_norm / rms_norm backward: ops ``layer_norm`` / ``rms_norm`` with ``pass: backward``.

Inputs: ``dy``, ``x`` (rows, cols), ``weight`` (cols,) when the key has one, and the forward's
statistics ``mean`` (layer_norm) and ``rstd`` (rows,) fp32. Outputs: ``dx``, ``dweight`` (with
a weight) and ``dbias`` (layer_norm with a bias) in x's dtype.
CUDA variants (kernels/norm/row_backward.cu): ``bwd_partials`` (dx, and per-group dweight /
dbias partials kept in registers while groups stride over the rows; a finishing column sum)
and ``bwd_colpass`` (dx a row per group; dweight / dbias by a second, column-parallel pass
over dy and x, then the same finishing sum). CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

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
    unsupported,
)
from dnnctl.ops.passes import (
    GRAD_TOL,
    BackwardSpec,
    NumpyBackward,
    f32_or_none,
    f64,
    term_scale,
)
from dnnctl.ops.registry import register_variant


def row_stats(x: np.ndarray, eps: float, rms: bool) -> tuple[np.ndarray, np.ndarray]:
    """(mean, rstd) per row as the forward computes them (mean is zeros for rms_norm)."""
    if rms:
        return np.zeros(x.shape[0], x.dtype), 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    mean = x.mean(axis=-1)
    d = x - mean[:, None]
    return mean, 1.0 / np.sqrt(np.mean(d * d, axis=-1) + eps)


def rownorm_backward_numpy(dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                           mean: np.ndarray | None, rstd: np.ndarray,
                           rms: bool) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of layer_norm (rms=False) / rms_norm in the inputs' precision."""
    with np.errstate(all="ignore"):
        xh = (x if rms else x - mean[:, None]) * rstd[:, None]
        g = dy * w if w is not None else dy
        n = x.shape[-1]
        dot = (g * xh).sum(axis=-1, keepdims=True) / n
        inner = g - xh * dot
        if not rms:
            inner = inner - g.sum(axis=-1, keepdims=True) / n
        return {"dx": rstd[:, None] * inner, "dweight": (dy * xh).sum(axis=0),
                "dbias": dy.sum(axis=0)}


def rownorm_dx_scale(dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                     mean: np.ndarray | None, rstd: np.ndarray, rms: bool) -> np.ndarray:
    """rstd (|g| + |mean(g)| + |xhat mean(g xhat)|) (rms: without mean(g)): the terms dx is
    the sum of; a row of length 1 has dx = 0 exactly from terms of size rstd |g|."""
    with np.errstate(all="ignore"):
        xh = (x if rms else x - mean[:, None]) * rstd[:, None]
        g = dy * w if w is not None else dy
        n = x.shape[-1]
        terms = [g, xh * ((g * xh).sum(axis=-1, keepdims=True) / n)]
        if not rms:
            terms.append(g.sum(axis=-1, keepdims=True) / n)
        return rstd[:, None] * term_scale(*terms)


class RowNormBackward(BackwardSpec):
    def __init__(self, rms: bool) -> None:
        self.rms = rms

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        rows, cols, dt = problem["rows"], problem["cols"], problem["dtype"]
        specs = {"dy": TensorSpec((rows, cols), dt), "x": TensorSpec((rows, cols), dt)}
        if problem["weight"]:
            specs["weight"] = TensorSpec((cols,), dt)
        if not self.rms:
            specs["mean"] = TensorSpec((rows,), "float32")
        specs["rstd"] = TensorSpec((rows,), "float32")
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        rows, cols, dt = problem["rows"], problem["cols"], problem["dtype"]
        specs = {"dx": TensorSpec((rows, cols), dt)}
        if problem["weight"]:
            specs["dweight"] = TensorSpec((cols,), dt)
        if problem.get("bias", False):
            specs["dbias"] = TensorSpec((cols,), dt)
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        rows, cols, dt = problem["rows"], problem["cols"], np_dtype(problem["dtype"])
        x = (rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt)
        mean, rstd = row_stats(x.astype(np.float64), op.attrs["eps"], self.rms)
        out = {"dy": rng.standard_normal((rows, cols)).astype(dt), "x": x}
        if problem["weight"]:
            out["weight"] = (rng.standard_normal(cols) * 0.5 + 1.0).astype(dt)
        if not self.rms:
            out["mean"] = mean.astype(np.float32)
        out["rstd"] = rstd.astype(np.float32)
        return out

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        res = rownorm_backward_numpy(up["dy"], up["x"], up.get("weight"), up.get("mean"),
                                     up["rstd"], self.rms)
        return {k: res[k] for k in self.output_specs(op, problem)}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": rownorm_dx_scale(up["dy"], up["x"], up.get("weight"), up.get("mean"),
                                       up["rstd"], self.rms)}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]] * (5 if output != "dx" else 1)

    def flops(self, op: Op, problem: Problem) -> float:
        return 10.0 * problem["rows"] * problem["cols"]

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("bwd_numpy")
        cols, dtype = problem["cols"], problem["dtype"]
        vec = max(v for v in mc.VECS if mc.vec_fits(dtype, v) and cols % v == 0)
        tpr = mr.next_pow2(mc.cdiv(cols, MAX_ELEMS))  # the fewest threads holding a row
        tpr = tpr if tpr <= 32 else min(1024, max(128, tpr))
        params = {"block": max(128, tpr), "tpr": tpr, "vec": vec, "waves": 2}
        from dnnctl.ops.registry import get_variant

        for name in ("bwd_partials", "bwd_colpass"):
            v = get_variant(problem.op, "cupy", name)
            if v.supports(problem, device) and v.valid_params(problem, params, device):
                return Choice.of(name, params)
        return Choice.of("bwd_stream", {"block": 1024 if cols >= 8192 else 256, "vec": vec})


# ----------------------------------------------------------------------------- CUDA

MAX_ELEMS = 16  # floats per thread per row (x and dy in registers, plus partials)


class _RowNormBwdCuda(Variant):
    backend = "cupy"
    passes = ("backward",)
    source = "norm/row_backward.cu"
    rms = False
    part = 0
    params = {"block": (128, 256, 512, 1024), "tpr": (1, 2, 4, 8, 16, 32, 128, 256, 512, 1024),
              "vec": mc.VECS, "waves": (1, 2, 4)}

    def nv(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return mc.cdiv(problem["cols"], params["tpr"] * vec)

    def vec_valid(self, problem: Problem, vec: int) -> bool:
        return mc.vec_fits(problem["dtype"], vec) and problem["cols"] % vec == 0

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        tpr, block, vec = params["tpr"], params["block"], params["vec"]
        if tpr > 32 and tpr != block:
            return False
        if not self.part and params["waves"] != 2:
            return False  # waves only size the partials grid
        return (self.vec_valid(problem, vec) and tpr <= block
                and self.nv(problem, params, vec) * vec <= MAX_ELEMS
                and (tpr == 1 or (tpr // 2) * vec < problem["cols"]))

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["cols"] > 1024 * MAX_ELEMS:
            return unsupported(f"rows longer than {1024 * MAX_ELEMS} do not fit a block's "
                               "registers")
        if problem["rows"] >= 2**31:
            return unsupported("2^31 rows or more")
        return SUPPORTED

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "RMS": int(self.rms),
                "HAS_W": int(problem["weight"]), "HAS_B": int(problem.get("bias", False))}

    def groups(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        rpb = params["block"] // params["tpr"]
        blocks = mc.cdiv(problem["rows"], rpb)
        if self.part:
            blocks = min(blocks, mc.sm_count(device) * params["waves"])
        return blocks

    def splits(self, problem: Problem, device: Any) -> int:
        return max(1, min(mc.cdiv(problem["rows"], 32),
                          mc.cdiv(4 * mc.sm_count(device), mc.cdiv(problem["cols"], 32))))

    def partial_rows(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        if self.part:
            return self.groups(problem, params, device) * (params["block"] // params["tpr"])
        return self.splits(problem, device)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 8 * problem["cols"] * self.partial_rows(problem, params, None)

    def row_kernel(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return (f"norm_bwd_rows<{params['block']},{params['tpr']},{vec},"
                f"{self.nv(problem, params, vec)},{self.part}>")

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        rows, cols = problem["rows"], problem["cols"]
        block = params["block"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        names = [self.row_kernel(problem, params, v) for v in dict.fromkeys((vec, 1))]
        grads = problem["weight"] or problem.get("bias", False)
        names += ["norm_bwd_cols<256>", "norm_bwd_finish"]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        nparts = self.partial_rows(problem, params, device)
        part = mc.workspace(device, 8 * cols * nparts)
        grid = self.groups(problem, params, device)
        finish = mc.launch(mod, "norm_bwd_finish", mc.cdiv(cols, 128), 128)
        fdims = finish.consts(np.int32(nparts), np.int32(cols))
        per = mc.cdiv(rows, nparts)
        colpass = mc.launch(mod, "norm_bwd_cols<256>", (mc.cdiv(cols, 32), nparts), 256)
        cdims = colpass.consts(np.int32(rows), np.int32(cols), np.int32(per))
        use_cols = grads and not self.part
        use_finish = grads

        def program(v: int) -> mr.Program:
            rowk = mc.launch(mod, self.row_kernel(problem, params, v), grid, block)
            dims = rowk.consts(np.int32(rows), np.int32(cols))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                dy, x, w, mean, rstd, dx, dw, db = arrs
                rowk((dy, x, w, mean, rstd, dx, part, *dims))
                if use_cols:
                    colpass((dy, x, mean, rstd, part, *cdims))
                if use_finish:
                    finish((part, *fdims, dw, db))

            return go

        return mr.RowKernel(program(vec), program(1), vec * mc.dtype_size(problem["dtype"]),
                            _arrays)


class _RowNormBwdStream(_RowNormBwdCuda):
    """Any length: a block per row reading it twice; the column pass for the parameters."""

    params = {"block": (256, 512, 1024), "vec": mc.VECS}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self.vec_valid(problem, params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["rows"] >= 2**31:
            return unsupported("2^31 rows or more")
        return SUPPORTED

    def groups(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        return problem["rows"]

    def row_kernel(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return f"norm_bwd_stream<{params['block']},{vec}>"


def _arrays(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
    return (inputs["dy"], inputs["x"], inputs.get("weight"), inputs.get("mean"),
            inputs["rstd"], outputs["dx"], outputs.get("dweight"), outputs.get("dbias"))


_DOCS = {"bwd_partials": "dx, and dweight / dbias partials per row group in registers "
                         "(groups stride over rows), then a column sum of the partials",
         "bwd_colpass": "dx a row per group, then a column-parallel pass over dy and x for "
                        "dweight / dbias, then a column sum of the split partials",
         "bwd_stream": "any length: a block per row reading it twice, then the column pass "
                       "for dweight / dbias"}

for _op in ("layer_norm", "rms_norm"):
    for _name, _part in (("bwd_partials", 1), ("bwd_colpass", 0), ("bwd_stream", 0)):
        register_variant(type(
            f"{''.join(p.title() for p in _op.split('_'))}{_name.title().replace('_', '')}",
            (_RowNormBwdStream if _name == "bwd_stream" else _RowNormBwdCuda,),
            {"op": _op, "name": _name, "part": _part, "doc": _DOCS[_name],
             "rms": _op == "rms_norm", "__module__": __name__}))


# ----------------------------------------------------------------------------- numpy


class _RowNormBwdNumpy(NumpyBackward):
    doc = "fp32 numpy"
    rms = False

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return rownorm_backward_numpy(
            mc.f32(inputs["dy"]), mc.f32(inputs["x"]), f32_or_none(inputs.get("weight")),
            f32_or_none(inputs.get("mean")), mc.f32(inputs["rstd"]), self.rms)


for _op in ("layer_norm", "rms_norm"):
    register_variant(type(f"{''.join(p.title() for p in _op.split('_'))}BwdNumpy",
                          (_RowNormBwdNumpy,), {"op": _op, "rms": _op == "rms_norm",
                                                "__module__": __name__}))

LAYER_NORM_BACKWARD = RowNormBackward(rms=False)
RMS_NORM_BACKWARD = RowNormBackward(rms=True)
