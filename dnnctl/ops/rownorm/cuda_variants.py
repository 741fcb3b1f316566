"""CUDA row-norm variants (kernels/norm/, shared by both ops through ``-DRMS``): ``warp_row``,
``block_row`` (row in registers, exact two-pass statistics), ``block_smem`` (row staged in
shared memory), ``async_smem``, ``welford`` (single-pass statistics, second read; any
length) and ``split_row``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Kernel, Problem
from dnnctl.ops.registry import register_variant


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


