"""conv2d ``depthwise_planes``: NCHW depthwise (K == C) by whole planes staged in shared
memory (kernels/conv2d/depthwise_planes.cu).

A block copies ``pb`` consecutive (image, channel) planes, one contiguous stretch of x, with
``vec``-wide loads and writes their outputs as one contiguous stretch of y; the plane size,
filter, stride, dilation and padding are compiled in. For the small planes of MobileNet-style
layers (7x7 .. 56x56), where the spatial tiles of ``depthwise`` overhang the plane and each
block does little work. Planes of more than ~12K elements (fp32 staging in 48 KB of static
shared memory) are left to ``depthwise``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, next_pow2
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

SMEM_LIMIT = 48 * 1024  # static shared memory per block
SMEM_TARGET = 24 * 1024  # default: several blocks per SM overlap their loads


def _esize(g: ConvGeom) -> int:
    return 4 if g.dtype == "float32" else 2


def smem_bytes(g: ConvGeom, pb: int) -> int:
    """Shared memory of a block: pb fp32 input planes and their filters."""
    return 4 * pb * (g.h * g.w + g.r * g.s)


@register_variant
class CudaDepthwisePlanes(CudaConv):
    """Depthwise NCHW: contiguous plane stretches through shared memory."""

    name = "depthwise_planes"
    source = "conv2d/depthwise_planes.cu"
    doc = "groups == C == K, NCHW: whole planes staged in shared memory, contiguous I/O"
    params = {"pb": (1, 2, 4, 8, 16, 32), "threads": (128, 256), "vec": (1, 2, 4, 8)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if not (g.groups == g.c == g.k):
            return unsupported(f"needs groups == C == K (depthwise, multiplier 1); got "
                               f"groups={g.groups}, c={g.c}, k={g.k}")
        if g.nhwc:
            return unsupported("NHWC: the channel-vectorized depthwise kernel fits that layout")
        if g.r > 11 or g.s > 11:
            return unsupported("filters above 11x11 are not unrolled")
        if max(g.sh, g.sw, g.dh, g.dw) > 8:
            return unsupported("stride or dilation above 8")
        if smem_bytes(g, 1) > SMEM_LIMIT:
            return unsupported(f"an input plane of {g.h}x{g.w} does not fit in 48 KB of shared "
                               "memory; depthwise tiles it")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        pb, vec = params["pb"], params["vec"]
        if vec * _esize(g) > 16 or (g.h * g.w) % vec:
            return False
        if pb > 1 and pb > next_pow2(g.n * g.c):
            return False
        return smem_bytes(g, pb) <= SMEM_LIMIT

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        vec = next(v for v in (8, 4, 2, 1) if v * _esize(g) <= 16 and (g.h * g.w) % v == 0)
        sms = getattr(device, "sm_count", 0) or 132
        planes = g.n * g.c
        pb = 1
        # grow while the block stays small in shared memory and outputs, and the grid
        # still gives every SM a couple of blocks
        while (pb < 32 and smem_bytes(g, 2 * pb) <= SMEM_TARGET
               and 2 * pb * g.p * g.q <= 2048 and -(-planes // (2 * pb)) >= 2 * sms):
            pb *= 2
        threads = 256 if pb * g.p * g.q >= 512 else 128
        return self.first_valid(problem, device, [{"pb": pb, "threads": threads, "vec": vec}])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        pb, threads, vec = params["pb"], params["threads"], params["vec"]
        base = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "KR": g.r, "KS": g.s,
                "STR_H": g.sh, "STR_W": g.sw, "DIL_H": g.dh, "DIL_W": g.dw, "H": g.h, "W": g.w,
                "P": g.p, "Q": g.q, "PT": g.pt, "PL": g.pl, "PB": pb, "THREADS": threads}
        fns: dict[int, Any] = {vec: rt.function(self.source, dict(base, VEC=vec), "dw_planes")}
        planes = g.n * g.c
        grid, block = (-(-planes // pb), 1, 1), (threads, 1, 1)
        tail = _cuda.i32(planes, g.c)
        align = vec * _esize(g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            v = vec
            if vec > 1 and rt.ptr(x) % align:
                # a DLPack view need not be vector-aligned: same kernel, scalar loads
                v = 1
                if 1 not in fns:
                    fns[1] = rt.function(self.source, dict(base, VEC=1), "dw_planes")
            bias, res, act, flags = _cuda.epilogue_args(g, y, inputs)
            fns[v](grid, block, (x, inputs["w"], y, bias, res, *tail, act, flags))

        return kernel
