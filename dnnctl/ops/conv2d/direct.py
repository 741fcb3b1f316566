"""conv2d ``direct`` on CUDA cores: output-stationary BM x BN tiles (kernels/conv2d/direct.cu).

Handles every problem: any layout, dtype, groups, stride, dilation and padding, no workspace.
Parameters: bm output pixels x bn output channels per block, tm x tn outputs per thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, epilogue_kernel, next_pow2
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant

BK = 8  # reduction slice per shared-memory stage


def _threads(p: Mapping[str, Any]) -> int:
    return (p["bm"] // p["tm"]) * (p["bn"] // p["tn"])


@register_variant
class CudaDirect(CudaConv):
    """Implicit patch gather + register-blocked FMA tiles; the universal fallback."""

    name = "direct"
    source = "conv2d/direct.cu"
    doc = "output-stationary tiles, input/weights staged in shared memory, register blocking"
    params = {"bm": (32, 64, 128), "bn": (16, 32, 64), "tm": (2, 4, 8), "tn": (2, 4)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if g.groups > 65535:
            return unsupported("more than 65535 groups (grid z limit)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        bm, bn, tm, tn = params["bm"], params["bn"], params["tm"], params["tn"]
        threads = _threads(params)
        if not 64 <= threads <= 256 or tm > bm or tn > bn:
            return False
        if (BK * bm) % threads or (BK * bn) % threads or threads % BK:
            return False
        if BK * bm // threads > 8 or BK * bn // threads > 8:  # registers for staged loads
            return False
        g = geometry(problem)
        # no tile more than twice the work there is (the smallest tile is always allowed)
        if bn > 16 and bn > next_pow2(g.kg):
            return False
        return not (bm > 32 and bm > next_pow2(g.npq))

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        bn = 64 if g.kg >= 64 else 32 if g.kg >= 32 else 16
        want = {"bm": 64 if g.npq >= 64 else 32, "bn": bn, "tm": 4, "tn": 4 if bn == 64 else 2}
        return self.first_valid(problem, device, [want])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc),
                   "BM": params["bm"], "BN": params["bn"], "TM": params["tm"],
                   "TN": params["tn"], "BK": BK}
        fn = rt.function(self.source, defines, "conv_direct")
        grid = ((g.npq + params["bm"] - 1) // params["bm"],
                (g.kg + params["bn"] - 1) // params["bn"], g.groups)
        block = (_threads(params), 1, 1)
        run = mc.Launch(fn, grid, block)  # scalar arguments converted once, here
        dims = run.consts(*_cuda.i32(g.n, g.c, g.h, g.w, g.k, g.p, g.q, g.r, g.s, g.sh, g.sw,
                                     g.pt, g.pl, g.dh, g.dw, g.groups),
                          *_cuda.epilogue_codes(g))
        return epilogue_kernel(run, g, dims)
