"""(N, C, H, W) geometry shared by batch_norm and group_norm (and the pools): key fields,
shapes, vector constraints, the launch geometry of the batch_norm normalize / statistics
kernels, and the call-side pieces both norms use (the affine pair default, the gradient
calls' argument checks, workspace padding)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import DTYPES, Field, Op, Problem, TensorSpec, np_dtype
from dnnctl.ops.passes import GRAD_TOL, BackwardSpec, f64

SPATIAL_FIELDS = {
    "n": Field("int", minimum=1, doc="batch"),
    "c": Field("int", minimum=1, doc="channels"),
    "h": Field("int", minimum=1, doc="height"),
    "w": Field("int", minimum=1, doc="width"),
}
# the element type and the memory order of such a tensor
TENSOR_FIELDS = {
    "dtype": Field("str", choices=DTYPES),
    "layout": Field("str", "NCHW", choices=("NCHW", "NHWC")),
}


def tensor_shape(problem: Problem) -> tuple[int, int, int, int]:
    n, c, h, w = problem["n"], problem["c"], problem["h"], problem["w"]
    return (n, c, h, w) if problem["layout"] == "NCHW" else (n, h, w, c)


def channel_shape(problem: Problem) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against the tensor."""
    c = problem["c"]
    return (1, c, 1, 1) if problem["layout"] == "NCHW" else (1, 1, 1, c)


def reduce_axes(problem: Problem) -> tuple[int, ...]:
    return (0, 2, 3) if problem["layout"] == "NCHW" else (0, 1, 2)


def numel(problem: Problem) -> int:
    return math.prod(tensor_shape(problem))


def affine_inputs(rng: np.random.Generator, c: int) -> dict[str, np.ndarray]:
    """Random float32 per-channel weight (around 1) and bias (around 0) of a test problem."""
    return {"weight": (rng.standard_normal(c) * 0.5 + 1.0).astype(np.float32),
            "bias": (rng.standard_normal(c) * 0.2).astype(np.float32)}


def vec_ok(problem: Problem, vec: int) -> bool:
    """A vector stays in one channel plane (NCHW) or one pixel's channel run (NHWC)."""
    if not mc.vec_fits(problem["dtype"], vec):
        return False
    inner = problem["h"] * problem["w"] if problem["layout"] == "NCHW" else problem["c"]
    return inner % vec == 0


def tile_lanes(problem: Problem, vec: int, tile: int = 128, block: int = 1024) -> int:
    """NHWC channel-vector lanes of a last-block reduction's channel tile: ``tile`` bytes of
    a row, at most a block (the TX of kernels/norm/bn_onepass.cu and bn_backward.cu)."""
    return min(problem["c"] // vec, block,
               max(1, tile // (vec * np_dtype(problem["dtype"]).itemsize)))


def best_vec(problem: Problem) -> int:
    return max(v for v in mc.VECS if vec_ok(problem, v))


# ----------------------------------------------------------------------------- batch_norm


def normalize_names(problem: Problem, block: int, vecs: Iterable[int], unroll: int) -> list[str]:
    """Template instances of bn_planes (NCHW) / bn_rows (NHWC) for the given vector widths."""
    kern = "bn_planes" if problem["layout"] == "NCHW" else "bn_rows"
    return [f"{kern}<{block},{v},{unroll}>" for v in vecs]


def normalize_launch(mod: Any, problem: Problem, block: int, vec: int, unroll: int,
                     device: Any) -> tuple[mc.Launch, tuple]:
    """The channel-stationary normalize launch and its trailing size arguments."""
    n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
    sms = mc.sm_count(device)
    if problem["layout"] == "NCHW":
        planes = n * c
        splits = max(1, min(mc.cdiv(sms * 8, planes), mc.cdiv(hw // vec, block * unroll),
                            65535))
        run = mc.launch(mod, f"bn_planes<{block},{vec},{unroll}>", (planes, splits), block)
        return run, run.consts(np.int32(c), np.int32(hw))
    rows = n * hw
    tx = min(c // vec, block)
    tile = (block // tx) * unroll
    resident = sms * max(1, 2048 // block)
    grid = max(1, min(mc.cdiv(rows, tile), 2 * resident))
    run = mc.launch(mod, f"bn_rows<{block},{vec},{unroll}>", grid, block)
    return run, run.consts(np.int64(rows), np.int32(c))


def stats_splits(problem: Problem, block: int, vec: int, waves: int, sms: int) -> int:
    """Partials per channel of the batch_norm statistics kernels."""
    n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
    if problem["layout"] == "NCHW":
        parts = max(1, mc.cdiv(hw // vec, block * 8))
        return max(1, min(mc.cdiv(sms * waves, c), n * parts, 65535))
    tx = min(c // vec, block)
    tiles = mc.cdiv(c // vec, tx)
    return max(1, min(mc.cdiv(sms * waves, tiles), mc.cdiv(n * hw, block // tx), 65535))


def stats_launches(mod: Any, problem: Problem, block: int, vec: int, waves: int,
                   modes: Iterable[int], device: Any) -> tuple[dict[int, Any], int]:
    """Per MODE (0 fused, 1 sums, 2 centered) a callable ``f((x, part, mean_in))``."""
    n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
    splits = stats_splits(problem, block, vec, waves, mc.sm_count(device))
    out: dict[int, Any] = {}
    for mode in modes:
        if problem["layout"] == "NCHW":
            nv = hw // vec
            parts = max(1, mc.cdiv(nv, block * 8))
            run = mc.launch(mod, f"bn_stats_planes<{block},{vec},{mode}>", (c, splits), block)
            dims: tuple = (np.int32(n), np.int32(c), np.int32(hw), np.int32(parts),
                           np.int32(mc.cdiv(nv, parts)))
        else:
            tx = min(c // vec, block)
            run = mc.launch(mod, f"bn_stats_rows<{block},{vec},{mode}>",
                            (splits, mc.cdiv(c // vec, tx)), block, 12 * block * vec)
            dims = (np.int64(n * hw), np.int32(c))
        out[mode] = _bind(run, dims)
    return out, splits


def _bind(run: mc.Launch, dims: tuple) -> Any:
    dims = run.consts(*dims)

    def go(args: tuple) -> None:
        run((*args, *dims))

    return go


def dims_of(shape: tuple[int, ...], layout: str, op: str) -> tuple[int, int, int, int]:
    """(n, c, h, w) of a rank-2..4 call tensor: (N, C), (N, C, L) / (N, L, C), 4-D."""
    from dnnctl.errors import ShapeError

    if len(shape) == 4:
        if layout == "NCHW":
            n, c, h, w = shape
        else:
            n, h, w, c = shape
    elif len(shape) == 3:
        n, c, h = shape if layout == "NCHW" else (shape[0], shape[2], shape[1])
        w = 1
    elif len(shape) == 2:
        (n, c), h, w = shape, 1, 1
    else:
        raise ShapeError(f"{op}: x has shape {shape}, expected rank 2, 3 or 4 "
                         f"({layout} for rank 4)")
    if 0 in shape:
        raise ShapeError(f"{op}: x has shape {shape} with a zero-size axis")
    return n, c, h, w


class NormBwdKernel(mc.VecKernel):
    """A spatial norm's backward kernel (batch_norm, group_norm): the vector program when
    dy, x and dx are aligned, else the scalar one; ``stats`` name the forward's saved
    statistics among the inputs."""

    __slots__ = ("stats",)

    def __init__(self, fast: Any, safe: Any, align: int, stats: tuple[str, str]) -> None:
        super().__init__(fast, safe, align)
        self.stats = stats

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        dy, x, dx = inputs["dy"], inputs["x"], outputs["dx"]
        go = self.fast if mc.aligned(self.align, dy, x, dx) else self.safe
        go(dy, x, inputs.get("weight"), inputs[self.stats[0]], inputs[self.stats[1]], dx,
           outputs.get("dweight"), outputs.get("dbias"))


def pad4(n: int) -> int:
    return -(-n // 4) * 4  # floats: 16-byte aligned offsets in the workspace


def affine_pair(xp: Any, weight: Any, bias: Any, c: int) -> tuple[Any, Any]:
    """Both or neither: a missing half of an affine pair is the identity (1 or 0)."""
    if weight is None and bias is None:
        return None, None
    if weight is None:
        weight = xp.ones(c, dtype=np.float32)
    if bias is None:
        bias = xp.zeros(c, dtype=np.float32)
    return weight, bias


def spatial_args(op: str, dy: Any, x: Any, layout: str) -> tuple[tuple[int, int, int, int], str]:
    """A spatial norm gradient call's (n, c, h, w) and dtype, dy checked against x."""
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    mc.check_out(dy, tuple(x.shape), dtype, "dy")
    return dims_of(tuple(x.shape), mc.check_layout(layout), op), dtype


class SpatialNormBackward(BackwardSpec):
    """What batch_norm's and group_norm's backward share: inputs dy, x, the float32 weight
    when affine and the forward's two saved statistics (``stats``, of ``stat_shape``); dx in
    the input's dtype, float32 dweight / dbias when affine; the tolerances (dx's own scales
    with the dtype). A subclass gives the numpy arithmetic: ``numpy`` (the gradients),
    ``dx_scale`` (see :meth:`Op.error_scale`), both f(problem, dy, x, weight, *stats), and
    ``saved_stats`` (the forward's statistics of a test input, float64)."""

    stats: tuple[str, str]
    x_offset = 0.0  # the mean of a test input
    numpy: Callable[..., dict[str, np.ndarray]]
    dx_scale: Callable[..., np.ndarray]

    def stat_shape(self, problem: Problem) -> tuple[int, ...]:
        raise NotImplementedError

    def saved_stats(self, problem: Problem, x: np.ndarray,
                    eps: float) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        t = TensorSpec(tensor_shape(problem), problem["dtype"])
        specs = {"dy": t, "x": t}
        if problem["affine"]:
            specs["weight"] = TensorSpec((problem["c"],), "float32")
        stat = TensorSpec(self.stat_shape(problem), "float32")
        return {**specs, self.stats[0]: stat, self.stats[1]: stat}

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape, dt = tensor_shape(problem), np_dtype(problem["dtype"])
        x = (rng.standard_normal(shape) * 1.5 + self.x_offset).astype(dt)
        stats = self.saved_stats(problem, x, op.attrs["eps"])
        out = {"dy": rng.standard_normal(shape).astype(dt), "x": x}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(problem["c"]) * 0.5 + 1.0).astype(np.float32)
        for name, stat in zip(self.stats, stats):
            out[name] = stat.astype(np.float32)
        return out

    def _args(self, inputs: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
        return (inputs["dy"], inputs["x"], inputs.get("weight"), inputs[self.stats[0]],
                inputs[self.stats[1]])

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return self.numpy(problem, *self._args(inputs))

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"dx": self.dx_scale(problem, *self._args(f64(inputs)))}

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"dx": TensorSpec(tensor_shape(problem), problem["dtype"])}
        if problem["affine"]:
            specs["dweight"] = TensorSpec((problem["c"],), "float32")
            specs["dbias"] = TensorSpec((problem["c"],), "float32")
        return specs

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        if output != "dx":
            return 1e-4 if problem["dtype"] == "float32" else GRAD_TOL[problem["dtype"]]
        return GRAD_TOL[problem["dtype"]] * (5 if problem["dtype"] == "float32" else 1)
