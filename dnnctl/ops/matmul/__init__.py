"""matmul: the op, its variants (numpy and CUDA) and the public ``matmul`` function.

Importing this package registers the op and every variant. The package is callable, so
``dnnctl.ops.matmul(a, b, ...)`` works whether ``dnnctl.ops.matmul`` resolved to this
package or to the function.
"""

from __future__ import annotations

from dnnctl.ops import make_callable
from dnnctl.ops.matmul import (  # noqa: F401  (registration)
    cublaslt,
    cupy_variants,
    numpy_variants,
    wgmma,
    wgmma_tma,
)
from dnnctl.ops.matmul.function import matmul
from dnnctl.ops.matmul.op import ACT_CODES, ACTIVATIONS, Matmul

__all__ = ["ACTIVATIONS", "ACT_CODES", "Matmul", "matmul"]


make_callable(__name__, matmul)
