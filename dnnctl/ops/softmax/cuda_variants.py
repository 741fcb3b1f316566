"""CUDA softmax variants (kernels/softmax/): ``warp_row`` (TPR threads per row, row in
registers), ``block_row`` (block per row, row in registers), ``block_smem`` (block per row
staged in shared memory), ``async_smem`` (the same staged by cp.async), ``online``
(single-pass online max/sum, second read for the output; any length) and ``split_row`` (few
long rows split across blocks; two launches)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import Problem


class _SoftmaxCuda(mr.RowVariant):
    op = "softmax"

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "LOG": int(problem["log"])}

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        return (inputs["x"], outputs["y"])


class _SoftmaxSplit(mr.SplitRowMixin):
    partial_bytes = 8  # (max, sum) per row chunk
    any_length = "online"


mr.register_strategies("softmax", _SoftmaxCuda, "softmax", (
    ("online", mr.OnlineMixin, "online",
     "a block per row, single-pass online max/sum, second read writes; any length"),
    ("split_row", _SoftmaxSplit, "split",
     "few long rows: chunks of a row on separate blocks, partial max/sum then apply"),
))
