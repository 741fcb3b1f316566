"""batch_norm: the op (per-channel normalization of (N, C, H, W) or rank 2..3, inference
with running statistics or training with batch statistics), its numpy and CUDA variants for
the forward and backward passes, and the public functions.

Importing this package registers the op and every variant.
"""

from __future__ import annotations

from dnnctl.ops import make_callable

# variants register on import (the order of registration is the tuner's order of preference)
from dnnctl.ops.batch_norm import (  # noqa: F401
    cuda_backward,
    cuda_exact,
    cuda_onepass,
    cuda_persist,
    cuda_variants,
    numpy_variants,
    vendor_backward,
)
from dnnctl.ops.batch_norm.backward import bn_backward_numpy
from dnnctl.ops.batch_norm.backward_function import batch_norm_backward
from dnnctl.ops.batch_norm.function import batch_norm
from dnnctl.ops.batch_norm.op import BatchNormOp, bn_numpy

__all__ = ["BatchNormOp", "batch_norm", "batch_norm_backward", "bn_backward_numpy", "bn_numpy"]


make_callable(__name__, batch_norm)
