"""CUDA softmax backward variants (kernels/softmax/backward.cu): ``bwd_warp_row`` (TPR
threads per row, rows in registers), ``bwd_block_row`` (a block per row, rows in registers)
and ``bwd_stream`` (a block per row, two reads; any length)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Problem
from dnnctl.ops.registry import register_variant


class _SoftmaxBwdCuda(mr.RowVariant):
    op = "softmax"
    passes = ("backward",)
    source = "softmax/backward.cu"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "LOG": int(problem["log"])}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["y"], inputs["dy"], outputs["dx"])


@register_variant
class SoftmaxBwdWarpRow(mr.WarpRowMixin, _SoftmaxBwdCuda):
    name = "bwd_warp_row"
    kernel = "softmax_bwd_warp"
    MAX_ELEMS = 32  # two rows (y, dy) in registers
    doc = "tpr threads per row (shuffles only), y and dy rows in registers; cols <= 1024"


@register_variant
class SoftmaxBwdBlockRow(mr.BlockRowMixin, _SoftmaxBwdCuda):
    name = "bwd_block_row"
    kernel = "softmax_bwd_block"
    MAX_COLS = 8192
    doc = "a block per row, y and dy rows in registers; cols <= 8192"

    @staticmethod
    def cap(block: int) -> int:
        return 8 if block == 1024 else 16  # floats per thread, per row (two rows)


@register_variant
class SoftmaxBwdStream(mr.OnlineMixin, _SoftmaxBwdCuda):
    name = "bwd_stream"
    kernel = "softmax_bwd_stream"
    doc = "a block per row, two reads of y and dy (dot product, then dx); any length"
