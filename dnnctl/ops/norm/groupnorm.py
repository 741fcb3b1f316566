"""group_norm forward, NCHW or NHWC, optional per-channel affine (fp32 weight / bias).

Op key ``group_norm``: n, c, h, w, groups, dtype, layout, affine. CUDA variants
(kernels/norm/): ``block_group`` (a block per (n, group): Welford pass, normalize pass from
global memory or from the group staged in shared memory) and ``split_group`` (few groups:
slices of a group on separate blocks, partial statistics then apply; two launches);
``async_group`` (groups staged by cp.async, one DRAM pass) is in gn_async.py. CPU variants:
``numpy_whole`` and ``numpy_samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
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
    unsupported,
)
from dnnctl.ops.norm import _spatial as sp
from dnnctl.ops.norm.gn_backward import GROUP_NORM_BACKWARD
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import register_op, register_variant


def gn_numpy(problem: Problem, x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None,
             eps: float) -> np.ndarray:
    """group_norm in numpy in x's precision (statistics in float64)."""
    n, c, h, wd, g = problem["n"], problem["c"], problem["h"], problem["w"], problem["groups"]
    if problem["layout"] == "NCHW":
        xg = x.reshape(n, g, c // g, h, wd)
        axes: tuple[int, ...] = (2, 3, 4)
    else:
        xg = x.reshape(n, h, wd, g, c // g)
        axes = (1, 2, 4)
    with np.errstate(all="ignore"):
        mean = xg.mean(axis=axes, keepdims=True, dtype=np.float64)
        d = xg - mean.astype(x.dtype)
        var = np.square(d, dtype=np.float64).mean(axis=axes, keepdims=True)
        y = (d * (1.0 / np.sqrt(var + eps)).astype(x.dtype)).reshape(x.shape)
        if w is not None:
            shape = sp.channel_shape(problem)
            y = y * w.astype(x.dtype).reshape(shape) + b.astype(x.dtype).reshape(shape)
    return y


@register_op
@with_backward(GROUP_NORM_BACKWARD)
class GroupNormOp(Op):
    name = "group_norm"
    doc = "group normalization: statistics over (C/G, H, W) per sample and group"
    fields = {**sp.SPATIAL_FIELDS, "groups": Field("int", minimum=1),
              "dtype": Field("str", choices=DTYPES),
              "layout": Field("str", "NCHW", choices=("NCHW", "NHWC")),
              "affine": Field("bool", True), "pass": PASS_FIELD}
    attrs = {"eps": 1e-5}

    def check(self, key: dict[str, Any]) -> None:
        if key["c"] % key["groups"]:
            raise UsageError(f"group_norm: c={key['c']} is not divisible by "
                             f"groups={key['groups']}")
        if key["c"] // key["groups"] * key["h"] * key["w"] >= 2**31:
            raise UsageError("group_norm: a group of 2^31 elements or more is not supported")

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        specs = {"x": TensorSpec(sp.tensor_shape(problem), problem["dtype"])}
        if problem["affine"]:
            specs["weight"] = TensorSpec((problem["c"],), "float32")
            specs["bias"] = TensorSpec((problem["c"],), "float32")
        return specs

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(sp.tensor_shape(problem), problem["dtype"])}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        c = problem["c"]
        x = rng.standard_normal(sp.tensor_shape(problem), dtype=np.float32) * 1.5 + 0.3
        out = {"x": x.astype(np_dtype(problem["dtype"]))}
        if problem["affine"]:
            out["weight"] = (rng.standard_normal(c) * 0.5 + 1.0).astype(np.float32)
            out["bias"] = (rng.standard_normal(c) * 0.2).astype(np.float32)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        eps = float(attrs.get("eps", self.attrs["eps"]))
        return {"y": gn_numpy(problem, up["x"], up.get("weight"), up.get("bias"), eps)}

    def tolerance(self, problem: Problem, output: str) -> float:
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[problem["dtype"]]

    def flops(self, problem: Problem) -> float:
        return 8.0 * sp.numel(problem)

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_samples")
        vec = gn_best_vec(problem)
        groups = problem["n"] * problem["groups"]
        size = problem["c"] // problem["groups"] * problem["h"] * problem["w"]
        if groups >= 2 * mc.sm_count(device):
            staged = self._async_choice(problem, vec, device)
            if staged is not None:
                return staged
        split = {"block": 256, "vec": vec, "waves": 4}
        v = GnSplitGroup()
        if (groups < 2 * mc.sm_count(device) and size >= 8192 and v.supports(problem, device)
                and v.valid_params(problem, split, device)):
            return Choice.of("split_group", split)
        stage = int(size * dtype_size(problem["dtype"]) <= 48 * 1024)
        block = min(1024, max(128, 1 << (mc.cdiv(size, vec * 4) - 1).bit_length()))
        return Choice.of("block_group", {"block": block, "vec": vec, "stage": stage})

    @staticmethod
    def _async_choice(problem: Problem, vec: int, device: Any) -> Choice | None:
        """async_group with the most groups per block that leave two blocks per SM
        (staged <= ~100 KB) and two blocks per SM in the grid; None if a group is too big."""
        from dnnctl.ops.registry import get_variant

        v = get_variant("group_norm", "cupy", "async_group")
        if not v.supports(problem, device):
            return None
        blocks = problem["n"] * problem["groups"]
        for gpb in (4, 2, 1):
            size = gpb * problem["c"] // problem["groups"] * problem["h"] * problem["w"]
            block = 512 if size >= 4096 * vec else 256
            params = {"block": block, "vec": vec, "gpb": gpb}
            if ((gpb == 1 or (size * dtype_size(problem["dtype"]) <= 100 * 1024
                              and blocks // gpb >= 2 * mc.sm_count(device)))
                    and v.valid_params(problem, params, device)):
                return Choice.of("async_group", params)
        return None


def gn_vec_ok(problem: Problem, vec: int) -> bool:
    """NCHW: a vector stays in one channel; NHWC: whole vectors tile a group's channel run."""
    if not mc.vec_fits(problem["dtype"], vec):
        return False
    if problem["layout"] == "NCHW":
        return (problem["h"] * problem["w"]) % vec == 0
    return (problem["c"] // problem["groups"]) % vec == 0


def gn_best_vec(problem: Problem) -> int:
    return max(v for v in mc.VECS if gn_vec_ok(problem, v))


# ----------------------------------------------------------------------------- CUDA


class _GnKernel:
    __slots__ = ("fast", "safe", "align")
    flat_io = True  # reads only data pointers: any contiguous arrays of the problem's sizes

    def __init__(self, fast: Any, safe: Any, align: int) -> None:
        self.fast, self.safe, self.align = fast, safe, align

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        go = self.fast if mc.aligned(self.align, x, y) else self.safe
        go(x, y, inputs.get("weight"), inputs.get("bias"), np.float32(attrs.get("eps", 1e-5)))


class _GnCuda(Variant):
    op = "group_norm"
    backend = "cupy"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                "LAYOUT": int(problem["layout"] == "NHWC"), "AFFINE": int(problem["affine"])}

    def dims(self, problem: Problem) -> tuple:
        return (np.int32(problem["c"]), np.int32(problem["h"] * problem["w"]),
                np.int32(problem["groups"]))

    def group_size(self, problem: Problem) -> int:
        return problem["c"] // problem["groups"] * problem["h"] * problem["w"]

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if self.valid_params(problem, params, device) else 1
        return _GnKernel(self.program(problem, params, vec, device),
                         self.program(problem, params, 1, device),
                         vec * dtype_size(problem["dtype"]))

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        raise NotImplementedError


@register_variant
class GnBlockGroup(_GnCuda):
    name = "block_group"
    source = "norm/gn_block.cu"
    doc = "a block per (n, group): Welford pass, then normalize (stage=1: from shared memory)"
    params = {"block": (128, 256, 512, 1024), "vec": mc.VECS, "stage": (0, 1)}

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def staged_bytes(self, problem: Problem) -> int:
        return -(-self.group_size(problem) * dtype_size(problem["dtype"]) // 16) * 16

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if params["stage"] and self.staged_bytes(problem) + 1024 > mc.smem_limit(device):
            return False
        busy = params["block"] == 128 or params["block"] // 2 * params["vec"] < \
            self.group_size(problem)
        return gn_vec_ok(problem, params["vec"]) and busy

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, stage = params["block"], params["stage"]
        if stage and self.staged_bytes(problem) + 1024 > mc.smem_limit(device):
            stage = 0
        fast = params["vec"] if self.valid_params(problem, params, device) else 1
        names = [f"gn_block<{block},{v},{stage}>" for v in dict.fromkeys((fast, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        run = mc.launch(mod, f"gn_block<{block},{vec},{stage}>",
                        problem["n"] * problem["groups"], block,
                        self.staged_bytes(problem) if stage else 0)
        dims = run.consts(*self.dims(problem))

        def go(x: Any, y: Any, w: Any, b: Any, eps: Any) -> None:
            run((x, y, w, b, *dims, run.f32(eps)))

        return go


@register_variant
class GnSplitGroup(_GnCuda):
    name = "split_group"
    source = "norm/gn_split.cu"
    doc = "few groups: slices of each group on separate blocks, partial Welford then apply"
    params = {"block": (256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["n"] * problem["groups"] > 65535:
            return unsupported("more than 65535 groups in the batch (grid y): use block_group")
        if self.group_size(problem) < 4096:
            return unsupported("groups smaller than 4096 elements gain nothing from splitting")
        if next(self.param_space(problem, device), None) is None:
            return unsupported("enough groups to fill the GPU one block each: use block_group")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return (gn_vec_ok(problem, params["vec"])
                and self.slices(problem, params, mc.sm_count(device)) >= 2)

    def slices(self, problem: Problem, params: Mapping[str, Any], sms: int) -> int:
        groups = problem["n"] * problem["groups"]
        most = self.group_size(problem) // (params["block"] * params["vec"] * 2)
        return max(1, min(mc.cdiv(sms * params["waves"], groups), most, 4096))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 12 * problem["n"] * problem["groups"] * self.slices(problem, params, 132)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block = params["block"]
        slices = self.slices(problem, params, mc.sm_count(device))
        groups = problem["n"] * problem["groups"]
        fast = params["vec"] if self.valid_params(problem, params, device) else 1
        names = [f"gn_split_{k}<{block},{v}>" for k in ("stats", "apply")
                 for v in dict.fromkeys((fast, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        stats = mc.launch(mod, f"gn_split_stats<{block},{vec}>", (slices, groups), block)
        apply = mc.launch(mod, f"gn_split_apply<{block},{vec}>", (slices, groups), block)
        part = mc.workspace(device, 12 * groups * slices)
        dims = stats.consts(*self.dims(problem))

        def go(x: Any, y: Any, w: Any, b: Any, eps: Any) -> None:
            stats((x, part, *dims))
            apply((x, part, y, w, b, *dims, apply.f32(eps)))

        return go


# ----------------------------------------------------------------------------- numpy


class _GnNumpy(Variant):
    op = "group_norm"
    backend = "numpy"
    per_sample = False

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        one = Problem(problem.op, tuple((k, 1 if k == "n" else v) for k, v in problem.key))
        per_sample = self.per_sample

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            w = None if "weight" not in inputs else mc.f32(inputs["weight"])
            b = None if "bias" not in inputs else mc.f32(inputs["bias"])
            eps = float(attrs.get("eps", 1e-5))
            if not per_sample:
                mc.put(y, gn_numpy(problem, mc.f32(x), w, b, eps))
                return
            for i in range(problem["n"]):
                mc.put(y[i:i + 1], gn_numpy(one, mc.f32(x[i:i + 1]), w, b, eps))

        return kernel


@register_variant
class GnNumpyWhole(_GnNumpy):
    name = "numpy_whole"
    doc = "whole-batch fp32 numpy"


@register_variant
class GnNumpySamples(_GnNumpy):
    name = "numpy_samples"
    doc = "fp32 numpy one sample at a time (cache-sized working set)"
    per_sample = True
