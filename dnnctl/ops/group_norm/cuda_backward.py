"""CUDA group_norm backward variant ``bwd_sums_dx``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Kernel, Problem, dtype_size
from dnnctl.ops.registry import register_variant


@register_variant
class GnBwdSumsDx(mc.CudaBackward):
    op = "group_norm"
    name = "bwd_sums_dx"
    source = "norm/gn_backward.cu"
    params = {"block": (128, 256, 512), "vec": mc.VECS}
    doc = ("per-(sample, channel) sums, per-group dx coefficients and per-channel parameter "
           "gradients (fixed order), then a vector stream for dx")

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return sp.vec_ok(problem, params["vec"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 8 * (problem["n"] * problem["c"] + problem["n"] * problem["groups"])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if sp.vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        n, c, g = problem["n"], problem["c"], problem["groups"]
        hw, numel = problem["h"] * problem["w"], sp.numel(problem)
        itype, block = mc.index_type(numel), params["block"]
        nchw = problem["layout"] == "NCHW"
        sums = f"gn_bwd_{'planes' if nchw else 'pixels'}<{block}>"
        names = [sums, "gn_bwd_coef", "gn_bwd_params"]
        names += [f"gn_bwd_dx<{block},{v},{itype}>" for v in vecs]
        mod = mc.compile_cuda(self.source, {
            "DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "AFFINE": int(problem["affine"]),
            "LAYOUT": int(not nchw), "GROUPS": g}, names, device)
        ws = mc.workspace(device, self.workspace_bytes(problem, params))
        part, coef = ws[:2 * n * c], ws[2 * n * c:2 * n * c + 2 * n * g]
        red = mc.launch(mod, sums, (c, n) if nchw else (mc.cdiv(c, 32), n), block)
        rdims = red.consts(np.int32(c), np.int32(hw))
        co = mc.launch(mod, "gn_bwd_coef", mc.cdiv(n * g, 128), 128)
        cdims = co.consts(np.int32(n), np.int32(c), np.float32(numel // (n * g)))
        pa = mc.launch(mod, "gn_bwd_params", mc.cdiv(c, 128), 128)
        pdims = pa.consts(np.int32(n), np.int32(c))
        affine = problem["affine"]

        def program(v: int) -> Any:
            nvec = numel // v
            dxk = mc.stream_launch(mod, f"gn_bwd_dx<{block},{v},{itype}>", nvec, block, device)
            ddims = dxk.consts(mc.index_scalar(nvec, itype), np.int32(c), np.int32(hw))

            def go(dy: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any,
                   db: Any) -> None:
                red((dy, x, mean, part, *rdims))
                co((part, rstd, w, coef, *cdims))
                if affine:
                    pa((part, rstd, dw, db, *pdims))
                dxk((dy, x, w, mean, rstd, coef, dx, *ddims))

            return go

        return sp.NormBwdKernel(program(vec), program(1), vec * dtype_size(problem["dtype"]),
                                  ("mean", "rstd"))
