"""pool2d ``nhwc_tile``: output tiles computed from an input patch staged in shared memory.

A block copies the input patch of TH x TW output windows (CT channel vectors, ~128 bytes per
pixel) into shared memory with cp.async, then reduces every window from there
(kernels/pool/nhwc_tile.cu). Overlapping windows (stride < kernel) then cost one L2 -> SM
transfer per input byte and tile instead of one per window tap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Problem, Support, dtype_size, unsupported
from dnnctl.ops.pool.pool2d import _PoolCuda, _vec_ok, out_hw
from dnnctl.ops.registry import register_variant


@register_variant
class PoolNhwcTile(_PoolCuda):
    name = "nhwc_tile"
    source = "pool/nhwc_tile.cu"
    kernel = "pool_tile"
    layout = "NHWC"
    doc = ("NHWC: th x tw output pixels per block from an input patch staged in shared "
           "memory by cp.async (overlapping windows read once per tile)")
    params = {"block": (128, 256), "vec": mc.VECS, "th": (2, 4, 8), "tw": (4, 8, 16)}

    @staticmethod
    def ct(problem: Problem, vec: int) -> int:
        """Channel vectors per tile: about 128 bytes of each pixel (all of them if fewer)."""
        return min(problem["c"] // vec, max(1, 128 // (vec * dtype_size(problem["dtype"]))))

    def patch_bytes(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
        dh, dw = problem["dilation"]
        ih = (params["th"] - 1) * sh + (kr - 1) * dh + 1
        iw = (params["tw"] - 1) * sw + (ks - 1) * dw + 1
        return ih * iw * self.ct(problem, vec) * vec * dtype_size(problem["dtype"])

    def tiles(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        oh, ow = out_hw(problem)
        return (problem["n"] * mc.cdiv(oh, params["th"]) * mc.cdiv(ow, params["tw"])
                * mc.cdiv(problem["c"] // vec, self.ct(problem, vec)))

    def fits(self, problem: Problem, params: Mapping[str, Any], vec: int, device: Any) -> bool:
        return (self.patch_bytes(problem, params, vec) + 1024 <= mc.smem_limit(device)
                and self.tiles(problem, params, vec) < 2**31)

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        oh, ow = out_hw(problem)
        th, tw = params["th"], params["tw"]
        useful = (th == 2 or th // 2 < oh) and (tw == 4 or tw // 2 < ow)
        return (_vec_ok(problem, params["vec"]) and useful
                and self.fits(problem, params, params["vec"], device)
                and self.fits(problem, params, 1, device))

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem.get("indices", False):
            return unsupported("writes no indices: use argmax_thread")
        if problem["layout"] != "NHWC":
            return unsupported("NHWC only")
        if next(self.param_space(problem, device), None) is None:
            return unsupported("the smallest input patch does not fit in shared memory")
        return SUPPORTED

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, th, tw = params["block"], params["th"], params["tw"]

        def name(v: int) -> str:
            return f"pool_tile<{block},{v},{th},{tw},{self.ct(problem, v)}>"

        mod = self.compile(problem, params, device, name)
        run = mc.launch(mod, name(vec), self.tiles(problem, params, vec), block,
                        self.patch_bytes(problem, params, vec))
        return lambda x, y: run((x, y))

