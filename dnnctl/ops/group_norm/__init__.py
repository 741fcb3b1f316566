"""group_norm: the op (normalization over (C/groups, H, W) per sample), its numpy and CUDA
variants for the forward and backward passes, and the public functions.

Importing this package registers the op and every variant.
"""

from __future__ import annotations

from dnnctl.ops import make_callable

# variants register on import (the order of registration is the tuner's order of preference)
from dnnctl.ops.group_norm import (  # noqa: F401
    cuda_backward,
    cuda_variants,
    cuda_variants_async,
    numpy_variants,
)
from dnnctl.ops.group_norm.backward import gn_backward_numpy, gn_stats
from dnnctl.ops.group_norm.backward_function import group_norm_backward
from dnnctl.ops.group_norm.function import group_norm
from dnnctl.ops.group_norm.op import GroupNormOp, gn_numpy

__all__ = ["GroupNormOp", "gn_backward_numpy", "gn_numpy", "gn_stats", "group_norm",
           "group_norm_backward"]


make_callable(__name__, group_norm)
