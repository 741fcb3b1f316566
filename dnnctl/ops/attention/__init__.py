"""attention: the op, its variants (numpy, CUDA, vendor) and the public functions.

Importing this package registers the op and every variant. The package is callable, so
``dnnctl.ops.attention(q, k, v, ...)`` works whether ``dnnctl.ops.attention`` resolved to
this package or to the function.
"""

from __future__ import annotations

from dnnctl.ops import make_callable
from dnnctl.ops.attention import (  # noqa: F401  (registration)
    backward,
    bwd_wgmma,
    cupy_variants,
    decode_ring,
    numpy_variants,
    vendor,
    wgmma,
)
from dnnctl.ops.attention.function import attention, attention_backward
from dnnctl.ops.attention.op import Attention

__all__ = ["Attention", "attention", "attention_backward"]


make_callable(__name__, attention)
