"""CUDA softmax variants (kernels/softmax/): ``warp_row`` (TPR threads per row, row in
registers), ``block_row`` (block per row, row in registers), ``block_smem`` (block per row
staged in shared memory), ``async_smem`` (the same staged by cp.async), ``online``
(single-pass online max/sum, second read for the output; any length) and ``split_row`` (few
long rows split across blocks; two launches)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Kernel, Problem, dtype_size
from dnnctl.ops.registry import register_variant


class _SoftmaxCuda(mr.RowVariant):
    op = "softmax"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "LOG": int(problem["log"])}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["x"], outputs["y"])


@register_variant
class SoftmaxWarpRow(mr.WarpRowMixin, _SoftmaxCuda):
    name = "warp_row"
    source = "softmax/warp_row.cu"
    kernel = "softmax_warp"
    doc = "tpr threads per row (shuffles only), the row in registers; cols <= 2048"


@register_variant
class SoftmaxBlockRow(mr.BlockRowMixin, _SoftmaxCuda):
    name = "block_row"
    source = "softmax/block_row.cu"
    kernel = "softmax_block"
    doc = "a block per row, the row in registers; cols <= 16384"


@register_variant
class SoftmaxBlockSmem(mr.BlockSmemMixin, _SoftmaxCuda):
    name = "block_smem"
    source = "softmax/block_smem.cu"
    kernel = "softmax_smem"
    doc = "a block per row staged in shared memory; cols * itemsize <= opt-in shared memory"


@register_variant
class SoftmaxAsyncSmem(mr.AsyncSmemMixin, _SoftmaxCuda):
    name = "async_smem"
    source = "softmax/async_smem.cu"
    kernel = "softmax_async"
    doc = "a block per row staged in shared memory by cp.async (all copies in flight at once)"


@register_variant
class SoftmaxOnline(mr.OnlineMixin, _SoftmaxCuda):
    name = "online"
    source = "softmax/online.cu"
    kernel = "softmax_online"
    doc = "a block per row, single-pass online max/sum, second read writes; any length"


@register_variant
class SoftmaxSplitRow(mr.SplitRowMixin, _SoftmaxCuda):
    name = "split_row"
    source = "softmax/split_row.cu"
    doc = "few long rows: chunks of a row on separate blocks, partial max/sum then apply"
    partial_bytes = 8  # (max, sum) per row chunk
    any_length = "online"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        rows, cols = problem["rows"], problem["cols"]
        block, chunk = params["block"], params["chunk"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        splits = mc.cdiv(cols, chunk)
        names = [f"softmax_split_{k}<{block},{v}>" for k in ("stats", "apply")
                 for v in dict.fromkeys((vec, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        part = mc.workspace(device, self.workspace_bytes(problem, params))

        def program(v: int) -> mr.Program:
            stats = mc.launch(mod, f"softmax_split_stats<{block},{v}>", (splits, rows), block)
            apply = mc.launch(mod, f"softmax_split_apply<{block},{v}>", (splits, rows), block)
            dims = stats.consts(np.int32(rows), np.int32(cols), np.int32(chunk))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                x, y = arrs
                stats((x, part, *dims))
                apply((x, part, y, *dims))

            return go

        return mr.RowKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                            self.arrays)
