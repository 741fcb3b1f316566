"""Pooling with indices and pooling backward.

* ``pool2d`` with ``indices: true`` (max only): the forward also writes ``indices`` (int32,
  the output's shape), the argmax as the flat index ih * W + iw within the (n, c) plane, as
  PyTorch's ``max_pool2d(return_indices=True)``. Variants ``argmax_thread`` (CUDA) and
  ``numpy_argmax``.
* ``pool2d`` with ``pass: backward``: inputs ``dy`` (the output's shape) and, for max, the
  forward's ``indices``; output ``dx``. Variants ``bwd_gather`` (CUDA, kernels/pool/
  backward.cu: a thread per input element gathers from the outputs whose windows hold it;
  no atomics, deterministic) and ``bwd_numpy``.
(global_avg_pool2d backward: gap_backward.py.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import tensor_shape
from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    np_dtype,
    unsupported,
)
from dnnctl.ops.passes import BackwardSpec, NumpyBackward, NumpyVariant
from dnnctl.ops.registry import register_variant


def _geom(problem: Problem) -> tuple[int, ...]:
    (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
    (ph, pw), (dh, dw) = problem["pad"], problem["dilation"]
    return kr, ks, sh, sw, ph, pw, dh, dw


def _nchw(problem: Problem, a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if problem["layout"] == "NHWC" else a


def _back(problem: Problem, a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1) if problem["layout"] == "NHWC" else a)


def _taps(problem: Problem) -> Any:
    """Per kernel tap: (ih, iw) index grids of every output and their validity mask."""
    from dnnctl.ops.pool.geometry import out_hw

    kr, ks, sh, sw, ph, pw, dh, dw = _geom(problem)
    oh, ow = out_hw(problem)
    h, w = problem["h"], problem["w"]
    for i in range(kr):
        ih = np.arange(oh) * sh - ph + i * dh
        for j in range(ks):
            iw = np.arange(ow) * sw - pw + j * dw
            valid = ((ih >= 0) & (ih < h))[:, None] & ((iw >= 0) & (iw < w))[None, :]
            yield np.clip(ih, 0, h - 1), np.clip(iw, 0, w - 1), valid


def pool_argmax_numpy(problem: Problem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max pooling and its argmax (flat index in the plane; first max, a NaN wins, the last
    NaN kept) in x's precision."""
    xc = _nchw(problem, x)
    a = b = None
    for ih, iw, valid in _taps(problem):
        v = xc[:, :, ih[:, None], iw[None, :]]
        idx = (ih[:, None] * problem["w"] + iw[None, :]).astype(np.int32)
        if a is None:
            a = np.full(v.shape, -np.inf, x.dtype)
            b = np.full(v.shape, -1, np.int32)
        with np.errstate(invalid="ignore"):
            upd = valid & ((b < 0) | (v > a) | np.isnan(v))
        a = np.where(upd, v, a)
        b = np.where(upd, idx, b)
    return _back(problem, a), _back(problem, b)


def pool_backward_numpy(problem: Problem, dy: np.ndarray,
                        indices: np.ndarray | None) -> np.ndarray:
    """dx of pool2d (max: scatter by the saved indices; avg: dy / divisor over each window)."""
    from dnnctl.ops.pool.geometry import avg_divisor

    n, c, h, w = problem["n"], problem["c"], problem["h"], problem["w"]
    g = _nchw(problem, dy)
    dx = np.zeros((n * c, h * w), dy.dtype)
    if problem["mode"] == "max":
        ind = _nchw(problem, indices).reshape(n * c, -1)
        if ind.size and (int(ind.min()) < 0 or int(ind.max()) >= h * w):
            raise UsageError(f"max_pool2d_backward: indices must lie in [0, {h * w}) (the "
                             f"flat H*W position the forward saved), got {int(ind.min())} .. "
                             f"{int(ind.max())}", hint="pass the indices max_pool2d returned "
                             "with return_indices=True for this input size")
        rows = np.repeat(np.arange(n * c), ind.shape[1]).reshape(ind.shape)
        np.add.at(dx, (rows, ind), g.reshape(n * c, -1))
    else:
        share = g / avg_divisor(problem).astype(dy.dtype)
        for ih, iw, valid in _taps(problem):
            flat = (ih[:, None] * w + iw[None, :])[valid]
            np.add.at(dx, (slice(None), flat), share[:, :, valid].reshape(n * c, -1))
    return _back(problem, dx.reshape(n, c, h, w))


def _out_spec(problem: Problem) -> TensorSpec:
    from dnnctl.ops.pool.geometry import out_shape

    return TensorSpec(out_shape(problem), problem["dtype"])


class Pool2dBackward(BackwardSpec):
    def check(self, op: Op, key: dict[str, Any]) -> None:
        key["indices"] = key["mode"] == "max"  # max backward always takes the indices

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        out = _out_spec(problem)
        specs = {"dy": out}
        if problem["mode"] == "max":
            specs["indices"] = TensorSpec(out.shape, "int32")
        return specs

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        return {"dx": TensorSpec(tensor_shape(problem), problem["dtype"])}

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        dt = np_dtype(problem["dtype"])
        out = {"dy": rng.standard_normal(_out_spec(problem).shape).astype(dt)}
        if problem["mode"] == "max":  # the indices of a real forward
            x = rng.standard_normal(tensor_shape(problem)).astype(dt)
            out["indices"] = pool_argmax_numpy(problem, x.astype(np.float64))[1]
        return out

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return {"dx": pool_backward_numpy(problem, inputs["dy"], inputs.get("indices"))}

    def flops(self, op: Op, problem: Problem) -> float:
        return float(math.prod(tensor_shape(problem)) * math.prod(problem["kernel"]))

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        return Choice.of("bwd_gather", {"block": 256})


POOL2D_BACKWARD = Pool2dBackward()


def indices_specs(problem: Problem, specs: dict[str, TensorSpec]) -> dict[str, TensorSpec]:
    """The forward's outputs plus ``indices`` when the key asks for them."""
    if problem.get("indices", False):
        return {**specs, "indices": TensorSpec(specs["y"].shape, "int32")}
    return specs


def check_indices(key: dict[str, Any]) -> None:
    if key.get("indices") and key["mode"] != "max" and key.get("pass", "forward") == "forward":
        raise UsageError("pool2d: indices are only written by max pooling",
                         hint="drop indices, or use mode: max")


# ----------------------------------------------------------------------------- CUDA


class _PoolIndexKernel:
    __slots__ = ("run", "total", "names")
    flat_io = True

    def __init__(self, run: mc.Launch, total: Any, names: tuple[str, ...]) -> None:
        self.run, self.total, self.names = run, run.consts(total)[0], names

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        a, b, c = (inputs.get(n, outputs.get(n)) for n in self.names)
        self.run((a, b, c, self.total))


class _PoolBwdCuda(mc.CudaVariant):
    op = "pool2d"
    source = "pool/backward.cu"
    params = {"block": (128, 256, 512)}
    kernel = ""
    arrays: tuple[str, ...] = ()

    def defines(self, problem: Problem) -> dict[str, Any]:
        from dnnctl.ops.pool.geometry import kernel_defines

        return kernel_defines(problem)

    def threads(self, problem: Problem) -> int:
        raise NotImplementedError

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        from dnnctl.ops.pool.geometry import out_shape

        itype = mc.index_type(max(math.prod(tensor_shape(problem)),
                                  math.prod(out_shape(problem))))
        name = f"{self.kernel}<{params['block']},{itype}>"
        mod = mc.compile_cuda(self.source, self.defines(problem), [name], device)
        total = self.threads(problem)
        run = mc.launch(mod, name, max(1, mc.cdiv(total, params["block"])), params["block"])
        return _PoolIndexKernel(run, mc.index_scalar(total, itype), self.arrays)


@register_variant
class PoolArgmaxThread(_PoolBwdCuda):
    name = "argmax_thread"
    kernel = "pool_argmax"
    arrays = ("x", "y", "indices")
    doc = "max pooling with indices: a thread per output, NCHW or NHWC"

    def supports(self, problem: Problem, device: Any) -> Support:
        if not problem.get("indices", False):
            return unsupported("writes indices: for max pooling with indices: true")
        return SUPPORTED

    def threads(self, problem: Problem) -> int:
        from dnnctl.ops.pool.geometry import out_shape

        return math.prod(out_shape(problem))


@register_variant
class PoolBwdGather(_PoolBwdCuda):
    name = "bwd_gather"
    passes = ("backward",)
    kernel = "pool_bwd_gather"
    arrays = ("dy", "indices", "dx")
    doc = "a thread per input element gathers from every window holding it (no atomics)"

    def threads(self, problem: Problem) -> int:
        return math.prod(tensor_shape(problem))


# ----------------------------------------------------------------------------- numpy


@register_variant
class PoolNumpyArgmax(NumpyVariant):
    op = "pool2d"
    name = "numpy_argmax"
    doc = "max pooling with indices: fp32 numpy, a masked update per kernel tap"

    def supports(self, problem: Problem, device: Any) -> Support:
        if not problem.get("indices", False):
            return unsupported("writes indices: for max pooling with indices: true")
        return SUPPORTED

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        y, ind = pool_argmax_numpy(problem, mc.f32(inputs["x"]))
        return {"y": y, "indices": ind}


register_variant(NumpyBackward.of("pool2d", POOL2D_BACKWARD,
                                  "fp32 numpy: scatter by indices (max) or per kernel tap (avg)"))
