"""batch_norm training backward: op ``batch_norm`` with ``pass: backward`` (training: true).

Inputs: ``dy``, ``x`` (the tensor shape of the key), ``weight`` (affine) and the forward's
``save_mean`` / ``save_invstd`` (C,) fp32. Outputs: ``dx`` in x's dtype, ``dweight`` /
``dbias`` (C,) fp32 (affine). CUDA variant (kernels/norm/bn_backward.cu): ``bwd_reduce_dx``
(partial sums of dy and dy (x - mean) per (split, channel), folded by the last block of each
channel tile into the parameter gradients and dx = a dy + b (x - mean) + c0 coefficients,
then one vector stream for dx: two launches, x and dy read twice). CPU variant: ``bwd_numpy``.
"""

from __future__ import annotations

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


def bn_backward_numpy(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                      mean: np.ndarray, invstd: np.ndarray) -> dict[str, np.ndarray]:
    """dx, dweight, dbias of batch_norm training in the inputs' precision (sums in float64)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64)
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64)
        scale = invstd if w is None else invstd * w
        dx = scale.reshape(shape) * (dy - (sdy / count).reshape(shape)
                                     - xh * (sdx / count).reshape(shape))
    return {"dx": dx, "dweight": sdx, "dbias": sdy}


def bn_dx_scale(problem: Problem, dy: np.ndarray, x: np.ndarray, w: np.ndarray | None,
                mean: np.ndarray, invstd: np.ndarray) -> np.ndarray:
    """|invstd w| (|dy| + |mean(dy)| + |xhat mean(dy xhat)|): the terms dx is the sum of (two
    elements per channel give xhat = +-1 and dx ~ 0 from terms of size invstd |dy|)."""
    axes, shape = sp.reduce_axes(problem), sp.channel_shape(problem)
    count = x.size // problem["c"]
    with np.errstate(all="ignore"):
        xh = (x - mean.reshape(shape)) * invstd.reshape(shape)
        sdy = dy.sum(axis=axes, dtype=np.float64) / count
        sdx = (dy * xh).sum(axis=axes, dtype=np.float64) / count
        a = np.abs(invstd if w is None else invstd * w).reshape(shape)
        return a * term_scale(dy, sdy.reshape(shape), xh * sdx.reshape(shape))


class BatchNormBackward(BackwardSpec):
    def check(self, op: Op, key: dict[str, Any]) -> None:
        if not key["training"]:
            raise UsageError("batch_norm: the backward pass is of training mode (batch "
                             "statistics)", hint="set training: true in the key")

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        c, t = problem["c"], TensorSpec(sp.tensor_shape(problem), problem["dtype"])
        specs = {"dy": t, "x": t}
        if problem["affine"]:
            specs["weight"] = TensorSpec((c,), "float32")
        specs["save_mean"] = TensorSpec((c,), "float32")
        specs["save_invstd"] = TensorSpec((c,), "float32")
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"dx": TensorSpec(sp.tensor_shape(problem), problem["dtype"])}
        if problem["affine"]:
            specs["dweight"] = TensorSpec((problem["c"],), "float32")
            specs["dbias"] = TensorSpec((problem["c"],), "float32")
        return specs

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        c, shape, dt = problem["c"], sp.tensor_shape(problem), np_dtype(problem["dtype"])
        x = (rng.standard_normal(shape) * 1.5 + 0.7).astype(dt)
        axes = sp.reduce_axes(problem)
        xf = x.astype(np.float64)
        mean = xf.mean(axis=axes)
        var = np.square(xf - mean.reshape(sp.channel_shape(problem))).mean(axis=axes)
        out = {"dy": rng.standard_normal(shape).astype(dt), "x": x}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(c) * 0.5 + 1.0).astype(np.float32)
        out["save_mean"] = mean.astype(np.float32)
        out["save_invstd"] = (1.0 / np.sqrt(var + op.attrs["eps"])).astype(np.float32)
        return out

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        res = bn_backward_numpy(problem, up["dy"], up["x"], up.get("weight"), up["save_mean"],
                                up["save_invstd"])
        return {k: res[k] for k in self.output_specs(op, problem)}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = f64(inputs)
        return {"dx": bn_dx_scale(problem, up["dy"], up["x"], up.get("weight"),
                                  up["save_mean"], up["save_invstd"])}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        if output != "dx":
            return 1e-4 if problem["dtype"] == "float32" else GRAD_TOL[problem["dtype"]]
        return GRAD_TOL[problem["dtype"]] * (5 if problem["dtype"] == "float32" else 1)

    def flops(self, op: Op, problem: Problem) -> float:
        return 7.0 * sp.numel(problem)

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("bwd_numpy")
        return Choice.of("bwd_reduce_dx", {"block": 256, "vec": sp.best_vec(problem),
                                           "waves": 4})


BATCH_NORM_BACKWARD = BatchNormBackward()


def _pad4(n: int) -> int:
    return -(-n // 4) * 4  # floats: 16-byte aligned offsets in the workspace


# ----------------------------------------------------------------------------- CUDA


@register_variant
class BnBwdReduceDx(Variant):
    op = "batch_norm"
    backend = "cupy"
    passes = ("backward",)
    name = "bwd_reduce_dx"
    source = "norm/bn_backward.cu"
    doc = ("per-(split, channel) partial sums folded by the last block of each channel tile "
           "(parameter gradients, dx coefficients), then a vector stream for dx: two "
           "launches, x and dy read twice")
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    @staticmethod
    def lanes(problem: Problem, vec: int) -> int:
        """NHWC channel-vector lanes of a tile: 128 bytes of a row (as the kernel's)."""
        return min(problem["c"] // vec, max(1, 128 // (vec * dtype_size(problem["dtype"]))))

    def grid(self, problem: Problem, params: Mapping[str, Any], vec: int,
             sms: int) -> tuple[int, int]:
        """(splits, channel tiles) of the reduction kernel."""
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        block, waves = params["block"], params["waves"]
        if problem["layout"] == "NCHW":
            return max(1, min(mc.cdiv(sms * waves, c), mc.cdiv(n * hw // vec, block),
                              65535)), c
        tx = self.lanes(problem, vec)
        tiles = mc.cdiv(c // vec, tx)
        return max(1, min(mc.cdiv(sms * waves, tiles), mc.cdiv(n * hw, block // tx),
                          65535)), tiles

    def layout(self, problem: Problem, params: Mapping[str, Any], vec: int,
               sms: int) -> tuple[int, int, int, int]:
        """(splits, tiles, float offset of the coefficients, of the counters)."""
        s, tiles = self.grid(problem, params, vec, sms)
        coef = _pad4(2 * problem["c"] * s)
        return s, tiles, coef, coef + _pad4(3 * problem["c"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 4 * max(k + t for _, t, _, k in (self.layout(problem, params, v, 132)
                                                for v in (params["vec"], 1)))

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if sp.vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        numel = sp.numel(problem)
        itype = mc.index_type(numel)
        block, nchw = params["block"], problem["layout"] == "NCHW"
        kind = "planes" if nchw else "rows"
        names = [f"bn_bwd_reduce_{kind}<{block},{v}>" for v in vecs]
        names += [f"bn_bwd_dx<{block},{v},{itype}>" for v in vecs]
        mod = mc.compile_cuda(self.source, {
            "DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "AFFINE": int(problem["affine"]),
            "LAYOUT": int(not nchw)}, names, device)
        sms = mc.sm_count(device)

        def program(v: int) -> Any:
            s, tiles, coef_off, cnt_off = self.layout(problem, params, v, sms)
            ws = mc.workspace(device, 4 * (cnt_off + tiles))
            ws.fill(0)  # the counters start at zero; every call leaves them at zero
            part, coef = ws[:2 * c * s], ws[coef_off:coef_off + 3 * c]
            counters = ws[cnt_off:cnt_off + tiles].view(np.int32)
            if nchw:
                red = mc.launch(mod, f"bn_bwd_reduce_planes<{block},{v}>", (c, s), block)
                rdims = red.consts(np.int32(n), np.int32(c), np.int32(hw))
            else:
                red = mc.launch(mod, f"bn_bwd_reduce_rows<{block},{v}>", (s, tiles), block,
                                8 * block * v)
                rdims = red.consts(np.int64(n * hw), np.int32(c))
            nvec = numel // v
            dx = mc.launch(mod, f"bn_bwd_dx<{block},{v},{itype}>",
                           max(1, min(mc.cdiv(nvec, block), sms * 2048 // block * 2)), block)
            ddims = dx.consts(mc.index_scalar(nvec, itype), np.int32(c), np.int32(hw))

            def go(dy: Any, x: Any, w: Any, mean: Any, invstd: Any, dxa: Any, dw: Any,
                   db: Any) -> None:
                red((dy, x, mean, part, counters, *rdims, invstd, w, dw, db, coef))
                dx((dy, x, mean, coef, dxa, *ddims))

            return go

        return sp.NormBwdKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                                  ("save_mean", "save_invstd"))


# ----------------------------------------------------------------------------- numpy


@register_variant
class BnBwdNumpy(NumpyBackward):
    op = "batch_norm"
    doc = "fp32 numpy, float64 channel sums"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return bn_backward_numpy(problem, mc.f32(inputs["dy"]), mc.f32(inputs["x"]),
                                 f32_or_none(inputs.get("weight")), inputs["save_mean"],
                                 inputs["save_invstd"])
