"""conv2d: the op, its variants (numpy and CUDA) and the public ``conv2d`` function.

Importing this package registers the op and every variant. The package is callable, so
``dnnctl.ops.conv2d(x, w, ...)`` works whether ``dnnctl.ops.conv2d`` resolved to this
package (once imported, Python binds submodules on their parent) or to the function.
"""

from __future__ import annotations

from dnnctl.ops import make_callable

# variants register on import: numpy (CPU), then CUDA (import without CuPy; build lazily)
from dnnctl.ops.conv2d import (  # noqa: F401
    cuda_backward,
    depthwise,
    depthwise_planes,
    dgrad_phase,
    direct,
    fft,
    gemm_1x1,
    im2col_gemm,
    implicit_gemm,
    implicit_gemm_wgmma,
    nhwc_backward,
    nhwc_gemm,
    numpy_backward,
    numpy_variants,
    vendor,
    vendor_backward,
    wgrad_implicit_gemm,
    winograd,
)
from dnnctl.ops.conv2d.function import conv2d
from dnnctl.ops.conv2d.op import Conv2d, ConvGeom, geometry, output_size, pad4

__all__ = ["Conv2d", "ConvGeom", "conv2d", "geometry", "output_size", "pad4"]


make_callable(__name__, conv2d)
