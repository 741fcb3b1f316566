"""global_avg_pool2d: the mean over H x W per (n, c), NCHW -> (N, C, 1, 1), NHWC -> (N, 1, 1, C).

Op key ``global_avg_pool2d``: n, c, h, w, dtype, layout. CUDA variants (kernels/pool/):
``gap_reduce`` (one pass: NCHW `group` threads per plane; NHWC a block per (n, `group`
channel vectors)), ``gap_unrolled`` (the same with `unroll` loads in flight per thread) and
``gap_split`` (few large planes: pixel chunks on separate blocks, fp32
partials, a finalize kernel). CPU variants: ``numpy_mean`` and ``numpy_pairwise``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import SPATIAL_FIELDS, TENSOR_FIELDS, numel, tensor_shape, vec_ok
from dnnctl.ops.base import SUPPORTED, Choice, Problem, Support, TensorSpec, unsupported
from dnnctl.ops.passes import PASS_FIELD, NumpyVariant, with_backward
from dnnctl.ops.pool.gap_backward import GAP_BACKWARD, gap_shape
from dnnctl.ops.registry import register_op, register_variant


def _axes(problem: Problem) -> tuple[int, int]:
    return (2, 3) if problem["layout"] == "NCHW" else (1, 2)


@register_op
@with_backward(GAP_BACKWARD)
class GlobalAvgPool2dOp(mc.MemoryOp):
    name = "global_avg_pool2d"
    doc = "mean over H x W per sample and channel"
    fields = {**SPATIAL_FIELDS, **TENSOR_FIELDS, "pass": PASS_FIELD}

    @mc.memo_per_problem
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec(tensor_shape(problem), problem["dtype"])}

    @mc.memo_per_problem
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(gap_shape(problem), problem["dtype"])}

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        x = np.asarray(inputs["x"], np.float64)
        return {"y": x.mean(axis=_axes(problem), keepdims=True)}

    def flops(self, problem: Problem) -> float:
        return float(numel(problem))

    @mc.memo_per_problem
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of("numpy_mean")
        vec = max(v for v in mc.VECS if vec_ok(problem, v))
        hw = problem["h"] * problem["w"]
        split = {"block": 256, "vec": vec, "waves": 4}
        v = GapSplit()
        if hw >= 4096 and v.supports(problem, device) and v.valid_params(problem, split, device):
            return Choice.of("gap_split", split)
        if problem["layout"] == "NCHW":
            group = min(32, max(4, 1 << (mc.cdiv(hw, vec * 4) - 1).bit_length()))
        else:  # as many channel vectors per block as there are (<= 32): few, long rows
            group = max(4, min(32, 1 << ((problem["c"] // vec).bit_length() - 1)))
        unrolled = {"block": 256, "vec": vec, "group": group, "unroll": 4}
        if GapUnrolled().valid_params(problem, unrolled, device):
            return Choice.of("gap_unrolled", unrolled)  # 4 loads in flight per thread
        return Choice.of("gap_reduce", {"block": 256, "vec": vec, "group": group})


# ----------------------------------------------------------------------------- CUDA


class _GapCuda(mc.CudaVariant):
    op = "global_avg_pool2d"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]]}


@register_variant
class GapReduce(_GapCuda):
    name = "gap_reduce"
    source = "pool/gap_reduce.cu"
    doc = "one pass: NCHW `group` threads per plane; NHWC a block per (n, `group` ch. vectors)"
    params = {"block": (128, 256, 512), "vec": mc.VECS, "group": (4, 8, 16, 32)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        vec, group = params["vec"], params["group"]
        if not vec_ok(problem, vec):
            return False
        if problem["layout"] == "NCHW":
            return group == 4 or (group // 2) * vec < problem["h"] * problem["w"]
        return group == 4 or group <= problem["c"] // vec

    def instances(self, params: Mapping[str, Any], vec: int) -> tuple[str, str]:
        """The NCHW (planes) and NHWC (rows) template instances at vector width ``vec``."""
        block, group = params["block"], params["group"]
        return f"gap_planes<{block},{group},{vec}>", f"gap_rows<{block},{vec}>"

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, group = params["block"], params["group"]
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        kind = 0 if problem["layout"] == "NCHW" else 1
        mod = self.compile(problem, params, device, lambda v: self.instances(params, v)[kind])
        name = self.instances(params, vec)[kind]
        if kind == 0:
            run = mc.launch(mod, name, mc.cdiv(n * c, block // group), block)
            dims: tuple = run.consts(np.int64(n * c), np.int32(hw))
        else:
            lanes = min(group, c // vec)
            run = mc.launch(mod, name, (n, mc.cdiv(c // vec, lanes)), block, 4 * block * vec)
            dims = run.consts(np.int32(hw), np.int32(c), np.int32(lanes))

        def go(x: Any, y: Any) -> None:
            run((x, y, *dims))

        return go


@register_variant
class GapUnrolled(GapReduce):
    name = "gap_unrolled"
    source = "pool/gap_unrolled.cu"
    doc = ("gap_reduce with `unroll` independent loads in flight per thread (one pass: NCHW "
           "`group` threads per plane; NHWC a block per (n, `group` channel vectors))")
    params = {**GapReduce.params, "unroll": (2, 4, 8)}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if not GapReduce.valid_params(self, problem, params, device):
            return False
        n_vec = problem["h"] * problem["w"]  # loads per pixel stripe (NHWC: pixels)
        if problem["layout"] == "NCHW":
            n_vec //= params["vec"]
            per = params["group"]
        else:
            per = params["block"] // min(params["group"], problem["c"] // params["vec"])
        return params["unroll"] == 2 or (params["unroll"] // 2) * per < n_vec

    def instances(self, params: Mapping[str, Any], vec: int) -> tuple[str, str]:
        block, group, u = params["block"], params["group"], params["unroll"]
        return f"gap_planes_u<{block},{group},{vec},{u}>", f"gap_rows_u<{block},{vec},{u}>"


@register_variant
class GapSplit(_GapCuda):
    name = "gap_split"
    source = "pool/gap_split.cu"
    doc = "few large planes: pixel chunks on separate blocks, fp32 partials, then finalize"
    params = {"block": (256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["h"] * problem["w"] < 2048:
            return unsupported("planes under 2048 pixels gain nothing from splitting")
        if next(self.param_space(problem, device), None) is None:
            return unsupported("enough planes to fill the GPU in one pass: use gap_reduce")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return vec_ok(problem, params["vec"]) and self.geometry(
            problem, params, params["vec"], mc.sm_count(device))[0] >= 2

    def geometry(self, problem: Problem, params: Mapping[str, Any], vec: int,
                 sms: int) -> tuple[int, int, int]:
        """(splits, chunk, lanes): chunk in vectors (NCHW) or pixels (NHWC)."""
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        block, target = params["block"], sms * params["waves"]
        if problem["layout"] == "NCHW":
            nv = hw // vec
            splits = max(1, min(mc.cdiv(target, n * c), nv // block, 65535))
            return splits, mc.cdiv(nv, splits), 0
        lanes = min(32, c // vec)
        tiles = mc.cdiv(c // vec, lanes)
        splits = max(1, min(mc.cdiv(target, n * tiles), hw // (block // lanes), 65535))
        return splits, mc.cdiv(hw, splits), lanes

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        splits = self.geometry(problem, params, params["vec"], 132)[0]
        return 4 * problem["n"] * problem["c"] * splits

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block = params["block"]
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        splits, chunk, lanes = self.geometry(problem, params, vec, mc.sm_count(device))
        part = mc.workspace(device, 4 * n * c * splits)
        kind = "planes" if problem["layout"] == "NCHW" else "rows"
        mod = self.compile(problem, params, device, lambda v: f"gap_split_{kind}<{block},{v}>",
                           lambda v: f"gap_split_{kind}_fin")
        fin = mc.launch(mod, f"gap_split_{kind}_fin", mc.cdiv(n * c, 128), 128)
        if kind == "planes":
            run = mc.launch(mod, f"gap_split_planes<{block},{vec}>", (n * c, splits), block)
            args: tuple = run.consts(np.int32(hw), np.int32(chunk))
            fin_args: tuple = fin.consts(np.int64(n * c), np.int32(splits), np.int32(hw))
        else:
            tiles = mc.cdiv(c // vec, lanes)
            run = mc.launch(mod, f"gap_split_rows<{block},{vec}>", (n * tiles, splits), block,
                            4 * block * vec)
            args = run.consts(np.int32(hw), np.int32(c), np.int32(lanes), np.int32(chunk))
            fin_args = fin.consts(np.int32(n), np.int32(splits), np.int32(c), np.int32(hw))

        def go(x: Any, y: Any) -> None:
            run((x, part, *args))
            fin((part, y, *fin_args))

        return go


# ----------------------------------------------------------------------------- numpy


@register_variant
class GapNumpyMean(NumpyVariant):
    op = "global_avg_pool2d"
    name = "numpy_mean"
    doc = "numpy mean with a float32 accumulator"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return {"y": inputs["x"].mean(axis=_axes(problem), keepdims=True, dtype=np.float32)}


@register_variant
class GapNumpyPairwise(NumpyVariant):
    op = "global_avg_pool2d"
    name = "numpy_pairwise"
    doc = "flatten the pixels to one contiguous axis and reduce it (pairwise sum, float32)"

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        x = mc.f32(inputs["x"])
        rows = x.reshape(n * c, hw) if problem["layout"] == "NCHW" else np.ascontiguousarray(
            x.reshape(n, hw, c).transpose(0, 2, 1)).reshape(n * c, hw)
        return {"y": (rows.sum(axis=1) / hw).reshape(gap_shape(problem))}
