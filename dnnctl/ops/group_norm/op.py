"""The group_norm op (n, c, h, w, groups, dtype, layout, affine): key schema, float64
reference, tolerances, counts and default variant choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Choice, Field, Problem, TensorSpec, dtype_size, np_dtype
from dnnctl.ops.group_norm.backward import GROUP_NORM_BACKWARD
from dnnctl.ops.passes import PASS_FIELD, with_backward
from dnnctl.ops.registry import get_variant, register_op


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
class GroupNormOp(mc.MemoryOp):
    name = "group_norm"
    doc = "group normalization: statistics over (C/G, H, W) per sample and group"
    fields = {**sp.SPATIAL_FIELDS, "groups": Field("int", minimum=1), **sp.TENSOR_FIELDS,
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
            out.update(sp.affine_inputs(rng, c))
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        up = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        eps = float(attrs.get("eps", self.attrs["eps"]))
        return {"y": gn_numpy(problem, up["x"], up.get("weight"), up.get("bias"), eps)}

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
        v = get_variant("group_norm", "cupy", "split_group")
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
