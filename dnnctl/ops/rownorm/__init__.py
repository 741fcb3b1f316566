"""rownorm: the row normalizations layer_norm and rms_norm over the last axis (two ops of
one key schema, sharing kernels through ``-DRMS``), their numpy and CUDA variants for the
forward and backward passes, and the public functions.

Importing this package registers both ops and every variant.
"""

from __future__ import annotations

# variants register on import (the order of registration is the tuner's order of preference)
from dnnctl.ops.rownorm import (  # noqa: F401
    cuda_backward,
    cuda_variants,
    numpy_variants,
)
from dnnctl.ops.rownorm.backward import row_stats, rownorm_backward_numpy
from dnnctl.ops.rownorm.backward_function import (
    layer_norm_backward,
    layer_norm_with_stats,
    rms_norm_backward,
    rms_norm_with_stats,
)
from dnnctl.ops.rownorm.function import layer_norm, rms_norm
from dnnctl.ops.rownorm.op import LayerNormOp, RmsNormOp, rownorm_numpy

__all__ = ["LayerNormOp", "RmsNormOp", "layer_norm", "layer_norm_backward",
           "layer_norm_with_stats", "rms_norm", "rms_norm_backward", "rms_norm_with_stats",
           "row_stats", "rownorm_backward_numpy", "rownorm_numpy"]
