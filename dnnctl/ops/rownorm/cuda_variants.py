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
from dnnctl.ops.base import Problem


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


class _NormSplit(mr.SplitRowMixin):
    partial_bytes = 12  # Welford (count, mean, m2) per row chunk
    any_length = "welford"


for _op in ("layer_norm", "rms_norm"):
    mr.register_strategies(_op, _NormCuda, "norm", (
        ("welford", mr.OnlineMixin, "welford",
         "a block per row, single-pass Welford statistics, second read normalizes; any length"),
        ("split_row", _NormSplit, "split",
         "few long rows: chunks of a row on separate blocks, partial Welford, apply"),
    ), rms=_op == "rms_norm")
