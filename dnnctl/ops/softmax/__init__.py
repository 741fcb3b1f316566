"""softmax: the op (softmax / log_softmax over the last axis of (rows, cols)), its numpy
and CUDA variants for the forward and backward passes, and the public functions.

Importing this package registers the op and every variant. The package is callable, so
``dnnctl.ops.softmax(x, ...)`` works whether ``dnnctl.ops.softmax`` resolved to this
package (once imported, Python binds submodules on their parent) or to the function.
"""

from __future__ import annotations

from dnnctl.ops import make_callable

# variants register on import (the order of registration is the tuner's order of preference)
from dnnctl.ops.softmax import (  # noqa: F401
    cuda_backward,
    cuda_variants,
    numpy_variants,
)
from dnnctl.ops.softmax.backward import softmax_backward_numpy
from dnnctl.ops.softmax.backward_function import log_softmax_backward, softmax_backward
from dnnctl.ops.softmax.function import log_softmax, softmax
from dnnctl.ops.softmax.op import SoftmaxOp, softmax_numpy

__all__ = ["SoftmaxOp", "log_softmax", "log_softmax_backward", "softmax", "softmax_backward",
           "softmax_backward_numpy", "softmax_numpy"]


make_callable(__name__, softmax)
