"""group_norm backward: op ``group_norm`` with ``pass: backward``.

Inputs: ``dy``, ``x``, ``weight`` (affine, fp32 (C,)) and the forward's statistics ``mean`` /
``rstd`` (N, groups) fp32. Outputs: ``dx`` and, affine, ``dweight`` / ``dbias`` (C,) fp32.
CUDA variant (kernels/norm/gn_backward.cu): ``bwd_sums_dx`` (per-(sample, channel) sums of dy
and dy (x - mean), per-group dx coefficients and per-channel parameter gradients folded in a
fixed order, then one vector stream for dx). CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

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
)
from dnnctl.ops.norm import _spatial as sp
from dnnctl.ops.passes import (
    GRAD_TOL,
    BackwardSpec,
    NumpyBackward,
    f32_or_none,
    f64,
    term_scale,
)
from dnnctl.ops.registry import register_variant


def _grouped(problem: Problem, a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    n, c, h, w, g = problem["n"], problem["c"], problem["h"], problem["w"], problem["groups"]
    if problem["layout"] == "NCHW":
        return a.reshape(n, g, c // g, h, w), (2, 3, 4)
    return a.reshape(n, h, w, g, c // g), (1, 2, 4)


def _stat_shape(problem: Problem) -> tuple[int, ...]:
    n, g = problem["n"], problem["groups"]
    return (n, g, 1, 1, 1) if problem["layout"] == "NCHW" else (n, 1, 1, g, 1)


def gn_stats(problem: Problem, x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, rstd) per (sample, group) as the forward computes them, float64."""
    xg, axes = _grouped(problem, x.astype(np.float64))
    mean = xg.mean(axis=axes)
    var = np.square(xg - mean.reshape(_stat_shape(problem))).mean(axis=axes)
    return mean, 1.0 / np.sqrt(var + eps)


def gn_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                      mean: np.ndarray, rstd: np.ndarray) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of group_norm in the inputs' precision."""
    xg, axes = _grouped(problem, x)
    dyg, _ = _grouped(problem, dy)
    st = _stat_shape(problem)
    cshape = sp.channel_shape(problem)
    with np.errstate(all="ignore"):
        xh = (xg - mean.reshape(st)) * rstd.reshape(st)
        gg = dyg if w is None else _grouped(problem, dy * w.reshape(cshape))[0]
        count = math.prod(xg.shape[a] for a in axes)
        s1 = gg.sum(axis=axes, keepdims=True) / count
        s2 = (gg * xh).sum(axis=axes, keepdims=True) / count
        dx = (rstd.reshape(st) * (gg - s1 - xh * s2)).reshape(x.shape)
        red = sp.reduce_axes(problem)
        xh_full = xh.reshape(x.shape)
        return {"dx": dx, "dweight": (dy * xh_full).sum(axis=red, dtype=np.float64),
                "dbias": dy.sum(axis=red, dtype=np.float64)}


def gn_dx_scale(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                mean: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """rstd (|g| + |mean(g)| + |xhat mean(g xhat)|) per group: the terms dx is the sum of."""
    xg, axes = _grouped(problem, x)
    st = _stat_shape(problem)
    with np.errstate(all="ignore"):
        xh = (xg - mean.reshape(st)) * rstd.reshape(st)
        gg = _grouped(problem, dy if w is None else dy * w.reshape(sp.channel_shape(problem)))[0]
        count = math.prod(xg.shape[a] for a in axes)
        s1 = gg.sum(axis=axes, keepdims=True) / count
        s2 = (gg * xh).sum(axis=axes, keepdims=True) / count
        return (rstd.reshape(st) * term_scale(gg, s1, xh * s2)).reshape(x.shape)


class GroupNormBackward(BackwardSpec):
    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        t = TensorSpec(sp.tensor_shape(problem), problem["dtype"])
        stat = TensorSpec((problem["n"], problem["groups"]), "float32")
        specs = {"dy": t, "x": t}
        if problem["affine"]:
            specs["weight"] = TensorSpec((problem["c"],), "float32")
        specs["mean"], specs["rstd"] = stat, stat
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"dx": TensorSpec(sp.tensor_shape(problem), problem["dtype"])}
        if problem["affine"]:
            specs["dweight"] = TensorSpec((problem["c"],), "float32")
            specs["dbias"] = TensorSpec((problem["c"],), "float32")
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape, dt = sp.tensor_shape(problem), np_dtype(problem["dtype"])
        x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(dt)
        mean, rstd = gn_stats(problem, x, op.attrs["eps"])
        out = {"dy": rng.standard_normal(shape).astype(dt), "x": x}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(problem["c"]) * 0.5 + 1.0).astype(np.float32)
        out["mean"], out["rstd"] = mean.astype(np.float32), rstd.astype(np.float32)
        return out

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        res = gn_backward_numpy(problem, up["dy"], up["x"], up.get("weight"), up["mean"],
                                up["rstd"])
        return {k: res[k] for k in self.output_specs(op, problem)}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": gn_dx_scale(problem, up["dy"], up["x"], up.get("weight"), up["mean"],
                                  up["rstd"])}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        if output != "dx":
            return 1e-4 if problem["dtype"] == "float32" else GRAD_TOL[problem["dtype"]]
        return GRAD_TOL[problem["dtype"]] * (5 if problem["dtype"] == "float32" else 1)

    def flops(self, op: Op, problem: Problem) -> float:
        return 8.0 * sp.numel(problem)

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("bwd_numpy")
        return Choice.of("bwd_sums_dx", {"block": 256, "vec": sp.best_vec(problem)})


GROUP_NORM_BACKWARD = GroupNormBackward()


@register_variant
class GnBwdSumsDx(Variant):
    op = "group_norm"
    backend = "cupy"
    passes = ("backward",)
    name = "bwd_sums_dx"
    source = "norm/gn_backward.cu"
    params = {"block": (128, 256, 512), "vec": mc.VECS}
    doc = ("per-(sample, channel) sums, per-group dx coefficients and per-channel parameter "
           "gradients (fixed order), then a vector stream for dx")

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 8 * (problem["n"] * problem["c"] + problem["n"] * problem["groups"])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if sp.vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        n, c, g = problem["n"], problem["c"], problem["groups"]
        hw, numel = problem["h"] * problem["w"], sp.numel(problem)
        itype, block = mc.index_type(numel), params["block"]
        nchw = problem["layout"] == "NCHW"
        sums = f"gn_bwd_{'planes' if nchw else 'pixels'}<{block}>"
        names = [sums, "gn_bwd_coef", "gn_bwd_params"]
        names += [f"gn_bwd_dx<{block},{v},{itype}>" for v in vecs]
        mod = mc.compile_cuda(self.source, {
            "DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "AFFINE": int(problem["affine"]),
            "LAYOUT": int(not nchw), "GROUPS": g}, names, device)
        ws = mc.workspace(device, self.workspace_bytes(problem, params))
        part, coef = ws[:2 * n * c], ws[2 * n * c:2 * n * c + 2 * n * g]
        red = mc.launch(mod, sums, (c, n) if nchw else (mc.cdiv(c, 32), n), block)
        rdims = red.consts(np.int32(c), np.int32(hw))
        co = mc.launch(mod, "gn_bwd_coef", mc.cdiv(n * g, 128), 128)
        cdims = co.consts(np.int32(n), np.int32(c), np.float32(numel // (n * g)))
        pa = mc.launch(mod, "gn_bwd_params", mc.cdiv(c, 128), 128)
        pdims = pa.consts(np.int32(n), np.int32(c))
        affine = problem["affine"]
        sms = mc.sm_count(device)

        def program(v: int) -> Any:
            nvec = numel // v
            dxk = mc.launch(mod, f"gn_bwd_dx<{block},{v},{itype}>",
                            max(1, min(mc.cdiv(nvec, block), sms * (2048 // block) * 2)), block)
            ddims = dxk.consts(mc.index_scalar(nvec, itype), np.int32(c), np.int32(hw))

            def go(dy: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any,
                   db: Any) -> None:
                red((dy, x, mean, part, *rdims))
                co((part, rstd, w, coef, *cdims))
                if affine:
                    pa((part, rstd, dw, db, *pdims))
                dxk((dy, x, w, mean, rstd, coef, dx, *ddims))

            return go

        return sp.NormBwdKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                                  ("mean", "rstd"))


@register_variant
class GnBwdNumpy(NumpyBackward):
    op = "group_norm"
    doc = "fp32 numpy (float64 parameter sums)"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return gn_backward_numpy(problem, mc.f32(inputs["dy"]), mc.f32(inputs["x"]),
                                 f32_or_none(inputs.get("weight")), mc.f32(inputs["mean"]),
                                 mc.f32(inputs["rstd"]))
