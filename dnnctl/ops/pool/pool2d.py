"""pool2d: max and average pooling with kernel / stride / padding / dilation / ceil_mode,
count_include_pad (avg), NCHW and NHWC — PyTorch's output-size and divisor rules.

Op key ``pool2d``. CUDA variants (kernels/pool/): ``thread_per_output`` (both layouts,
scalar), ``nhwc_vector`` (NHWC, VEC channels per thread with 16-byte loads) and
``nchw_rowtile`` (NCHW, OWT outputs of a row per thread reusing overlapping input columns);
``nhwc_tile`` (NHWC, output tiles from an input patch staged in shared memory) is in tiled.py.
The geometry is compiled in (one module per problem). CPU variants: ``numpy_taps`` (a strided
slice per kernel tap) and ``numpy_windows`` (sliding-window view, one reduction).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import SPATIAL_FIELDS, TENSOR_FIELDS, tensor_shape
from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
    Field,
    Problem,
    Support,
    TensorSpec,
    unsupported,
)
from dnnctl.ops.passes import PASS_FIELD, NumpyVariant, with_backward
from dnnctl.ops.pool import backward as bw
from dnnctl.ops.pool.geometry import (  # noqa: F401
    avg_divisor,
    kernel_defines,
    out_hw,
    out_shape,
    out_size,
)
from dnnctl.ops.registry import register_op, register_variant


def _padded(problem: Problem, x: np.ndarray) -> np.ndarray:
    """NCHW x padded with the pooling identity, large enough for every (ceil-mode) window."""
    (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
    (ph, pw), (dh, dw) = problem["pad"], problem["dilation"]
    oh, ow = out_hw(problem)
    n, c, h, w = x.shape
    hh = max(h + 2 * ph, (oh - 1) * sh + (kr - 1) * dh + 1)
    ww = max(w + 2 * pw, (ow - 1) * sw + (ks - 1) * dw + 1)
    fill = -np.inf if problem["mode"] == "max" else 0.0
    xp = np.full((n, c, hh, ww), fill, dtype=x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def pool_numpy(problem: Problem, x: np.ndarray, windows: bool = False) -> np.ndarray:
    """pool2d of x (problem layout) in x's precision; NaN propagates through max."""
    nhwc = problem["layout"] == "NHWC"
    xc = x.transpose(0, 3, 1, 2) if nhwc else x
    (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
    (dh, dw) = problem["dilation"]
    oh, ow = out_hw(problem)
    xp = _padded(problem, xc)
    is_max = problem["mode"] == "max"
    if windows:
        view = np.lib.stride_tricks.sliding_window_view(
            xp, ((kr - 1) * dh + 1, (ks - 1) * dw + 1), axis=(2, 3))
        view = view[:, :, :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw, ::dh, ::dw]
        acc = view.max(axis=(4, 5)) if is_max else view.sum(axis=(4, 5))
    else:
        acc = None
        for i in range(kr):
            for j in range(ks):
                tap = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                         j * dw:j * dw + (ow - 1) * sw + 1:sw]
                if acc is None:
                    acc = tap.copy()
                elif is_max:
                    np.maximum(acc, tap, out=acc)
                else:
                    acc += tap
    if not is_max:
        acc = acc / avg_divisor(problem).astype(acc.dtype)
    return acc.transpose(0, 2, 3, 1) if nhwc else acc


@register_op
@with_backward(bw.POOL2D_BACKWARD, absent={"indices": False})
class Pool2dOp(mc.MemoryOp):
    name = "pool2d"
    doc = "max / average 2-D pooling (PyTorch semantics), NCHW or NHWC"
    fields = {
        **SPATIAL_FIELDS,
        "mode": Field("str", choices=("max", "avg")),
        "kernel": Field("ints", length=2, minimum=1, doc="[r, s]"),
        "stride": Field("ints", None, length=2, minimum=1, doc="[sh, sw]; default = kernel"),
        "pad": Field("ints", (0, 0), length=2, minimum=0, doc="[ph, pw]"),
        "dilation": Field("ints", (1, 1), length=2, minimum=1),
        "ceil_mode": Field("bool", False),
        "count_include_pad": Field("bool", True, doc="avg only"),
        **TENSOR_FIELDS,
        "indices": Field("bool", False, doc="max: also write the argmax (int32, in the plane)"),
        "pass": PASS_FIELD,
    }

    def check(self, key: dict[str, Any]) -> None:
        bw.check_indices(key)
        if key["stride"] is None:
            key["stride"] = key["kernel"]
        if key["mode"] == "max":
            key["count_include_pad"] = True  # meaningless for max: one key per problem
        elif key["dilation"] != (1, 1):
            raise UsageError("pool2d: average pooling has no dilation (as PyTorch / cuDNN)")
        for axis, k, p in zip("hw", key["kernel"], key["pad"]):
            if p > k // 2:
                raise UsageError(f"pool2d: pad {p} on {axis} is more than half the kernel {k}",
                                 hint="PyTorch requires pad <= kernel // 2")
        probe = Problem(self.name, tuple(sorted(key.items())))
        oh, ow = out_hw(probe)
        if oh < 1 or ow < 1:
            raise UsageError(f"pool2d: the output would be {oh}x{ow} for input "
                             f"{key['h']}x{key['w']}", hint="use a smaller kernel or padding")
        if key["h"] * key["w"] * key["c"] >= 2**31:
            raise UsageError("pool2d: one sample of 2^31 elements or more is not supported")

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec(tensor_shape(problem), problem["dtype"])}

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return bw.indices_specs(problem, {"y": TensorSpec(out_shape(problem),
                                                          problem["dtype"])})

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if problem.get("indices", False):
            y, ind = bw.pool_argmax_numpy(problem, np.asarray(inputs["x"], np.float64))
            return {"y": y, "indices": ind}
        with np.errstate(invalid="ignore"):
            return {"y": pool_numpy(problem, np.asarray(inputs["x"], np.float64))}

    def tolerance(self, problem: Problem, output: str) -> float:
        if problem["mode"] == "max":
            return 0.0  # the maximum is one of the inputs: exact
        return super().tolerance(problem, output)

    def flops(self, problem: Problem) -> float:
        return float(math.prod(out_shape(problem)) * math.prod(problem["kernel"]))

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if problem.get("indices", False):
            return Choice.of("numpy_argmax") if backend == "numpy" else Choice.of(
                "argmax_thread", {"block": 256})
        if backend == "numpy":
            return Choice.of("numpy_taps")
        if problem["layout"] == "NHWC":
            vec = max(v for v in mc.VECS if _vec_ok(problem, v))
            if problem["stride"][0] < problem["kernel"][0] * problem["dilation"][0] or \
                    problem["stride"][1] < problem["kernel"][1] * problem["dilation"][1]:
                # overlapping windows: tiles staged in shared memory read each input once
                # per tile (round 1: nhwc_vector, 9 taps through L1/L2, 78% of copy)
                from dnnctl.ops.registry import get_variant

                tile = {"block": 256, "vec": vec, "th": 8, "tw": 8}
                v = get_variant("pool2d", "cupy", "nhwc_tile")
                if v.supports(problem, device) and v.valid_params(problem, tile, device):
                    return Choice.of("nhwc_tile", tile)
            return Choice.of("nhwc_vector", {"block": 256, "vec": vec})
        if problem["stride"][1] < problem["kernel"][1] * problem["dilation"][1]:
            return Choice.of("nchw_rowtile", {"block": 256, "owt": 4})
        return Choice.of("thread_per_output", {"block": 256})


def _vec_ok(problem: Problem, vec: int) -> bool:
    return mc.vec_fits(problem["dtype"], vec) and problem["c"] % vec == 0


# ----------------------------------------------------------------------------- CUDA


class _PoolCuda(mc.CudaVariant):
    op = "pool2d"
    layout = ""  # "" = both
    kernel = ""

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem.get("indices", False):
            return unsupported("writes no indices: use argmax_thread")
        if self.layout and problem["layout"] != self.layout:
            return unsupported(f"{self.layout} only")
        return SUPPORTED

    def defines(self, problem: Problem) -> dict[str, Any]:
        return kernel_defines(problem)

    def threads(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return math.prod(out_shape(problem))

    def instance(self, params: Mapping[str, Any], vec: int, itype: str) -> str:
        return f"{self.kernel}<{params['block']},{itype}>"

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        itype = mc.index_type(max(math.prod(tensor_shape(problem)),
                                  math.prod(out_shape(problem))))
        mod = self.compile(problem, params, device, lambda v: self.instance(params, v, itype))
        total = self.threads(problem, params, vec)
        run = mc.launch(mod, self.instance(params, vec, itype),
                        max(1, mc.cdiv(total, params["block"])), params["block"])
        size = run.consts(mc.index_scalar(total, itype))
        return lambda x, y: run((x, y, *size))


@register_variant
class PoolThreadPerOutput(_PoolCuda):
    name = "thread_per_output"
    source = "pool/thread_per_output.cu"
    kernel = "pool_thread"
    doc = "a thread per output element, scalar loads; NCHW or NHWC"
    params = {"block": (128, 256, 512)}


@register_variant
class PoolNhwcVector(_PoolCuda):
    name = "nhwc_vector"
    source = "pool/nhwc_vector.cu"
    kernel = "pool_nhwc"
    layout = "NHWC"
    doc = "NHWC: a thread per output pixel x VEC channels, 16-byte loads"
    params = {"block": (128, 256, 512), "vec": mc.VECS}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return _vec_ok(problem, params["vec"])

    def threads(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return math.prod(out_shape(problem)) // vec

    def instance(self, params: Mapping[str, Any], vec: int, itype: str) -> str:
        return f"{self.kernel}<{params['block']},{vec},{itype}>"


@register_variant
class PoolNchwRowTile(_PoolCuda):
    name = "nchw_rowtile"
    source = "pool/nchw_rowtile.cu"
    kernel = "pool_rowtile"
    layout = "NCHW"
    doc = "NCHW: owt outputs of a row per thread; overlapping input columns loaded once"
    params = {"block": (128, 256, 512), "owt": (2, 4, 8)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        owt = params["owt"]
        span = (owt - 1) * problem["stride"][1] + (problem["kernel"][1] - 1) * \
            problem["dilation"][1] + 1
        return span <= 64 and (owt == 2 or owt // 2 < out_hw(problem)[1])

    def threads(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        n, c, oh, ow = out_shape(problem)
        return n * c * oh * mc.cdiv(ow, params["owt"])

    def instance(self, params: Mapping[str, Any], vec: int, itype: str) -> str:
        return f"{self.kernel}<{params['block']},{params['owt']},{itype}>"


# ----------------------------------------------------------------------------- numpy


class _PoolNumpy(NumpyVariant):
    op = "pool2d"
    windows = False

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem.get("indices", False):
            return unsupported("writes no indices: use numpy_argmax")
        return SUPPORTED

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        with np.errstate(invalid="ignore"):
            return {"y": pool_numpy(problem, mc.f32(inputs["x"]), self.windows)}


@register_variant
class PoolNumpyTaps(_PoolNumpy):
    name = "numpy_taps"
    doc = "fp32: one strided slice per kernel tap, accumulated in place"


@register_variant
class PoolNumpyWindows(_PoolNumpy):
    name = "numpy_windows"
    doc = "fp32: a sliding-window view reduced in one call"
    windows = True
