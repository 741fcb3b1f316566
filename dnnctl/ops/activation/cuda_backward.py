"""CUDA activation backward variants (kernels/activation/backward.cu): ``bwd_stream`` (no
bias: a grid-stride vector stream) and ``bwd_channel`` (channel bias: channel-stationary
blocks write dx and partial bias sums, a finishing sum per channel)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.activation.backward import geometry, vec_ok
from dnnctl.ops.activation.op import ACT_CODE
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.registry import register_variant


class _ActBwdKernel(mc.VecKernel):
    __slots__ = ()

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        dy, x, dx = inputs["dy"], inputs["x"], outputs["dx"]
        go = self.fast if mc.aligned(self.align, dy, x, dx) else self.safe
        go(dy, x, inputs.get("bias"), dx, outputs.get("dbias"),
           float(attrs.get("negative_slope", 0.01)))


class _ActBwdCuda(mc.CudaBackward):
    op = "activation"
    source = "activation/backward.cu"
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8)}
    bias = "none"

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["bias"] != self.bias:
            return unsupported(f"bias {self.bias} only")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return vec_ok(problem, params["vec"])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if vec_ok(problem, params["vec"]) else 1
        vecs = tuple(dict.fromkeys((vec, 1)))
        mod = mc.compile_cuda(self.source, {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]],
                                            "ACT_FN_CODE": ACT_CODE[problem["fn"]]},
                              [n for v in vecs for n in self.names(problem, params, v)],
                              device)
        fast, safe = (self.program(mod, problem, params, v, device) for v in (vec, 1))
        return _ActBwdKernel(fast, safe, vec * dtype_size(problem["dtype"]))


@register_variant
class ActBwdStream(_ActBwdCuda):
    name = "bwd_stream"
    doc = "no bias: a grid-stride vector stream over dy and x"

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return vec_ok(problem, params["vec"]) and params["waves"] == 4

    def names(self, problem: Problem, params: Mapping[str, Any], vec: int) -> list[str]:
        itype = mc.index_type(math.prod(problem["shape"]))
        return [f"act_bwd_stream<{params['block']},{vec},{itype}>"]

    def program(self, mod: Any, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        n = math.prod(problem["shape"])
        itype, block = mc.index_type(n), params["block"]
        nvec = n // vec
        run = mc.stream_launch(mod, self.names(problem, params, vec)[0], nvec, block, device)
        dims = run.consts(mc.index_scalar(nvec, itype))

        def go(dy: Any, x: Any, b: Any, dx: Any, db: Any, slope: float) -> None:
            run((dy, x, dx, *dims, run.f32(slope)))

        return go


@register_variant
class ActBwdChannel(_ActBwdCuda):
    name = "bwd_channel"
    bias = "channel"
    doc = ("channel bias: channel-stationary blocks write dx and partial bias sums, then a "
           "per-channel finishing sum (dbias fused, deterministic)")

    def names(self, problem: Problem, params: Mapping[str, Any], vec: int) -> list[str]:
        kind = "planes" if problem["layout"] == "NCHW" else "rows"
        return [f"act_bwd_{kind}<{params['block']},{vec}>", "act_bwd_finish"]

    def splits(self, problem: Problem, params: Mapping[str, Any], vec: int, sms: int) -> int:
        n, inner, c = geometry(problem)
        block, waves = params["block"], params["waves"]
        if problem["layout"] == "NCHW":
            return max(1, min(mc.cdiv(sms * waves, c), mc.cdiv(n // c // vec, block), 65535))
        tx = min(c // vec, block)
        return max(1, min(mc.cdiv(sms * waves, mc.cdiv(c // vec, tx)),
                          mc.cdiv(n // c, block // tx), 65535))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 4 * geometry(problem)[2] * self.splits(problem, params, 1, 132)

    def program(self, mod: Any, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        n, inner, c = geometry(problem)
        block = params["block"]
        s = self.splits(problem, params, vec, mc.sm_count(device))
        part = mc.workspace(device, 4 * c * s)
        if problem["layout"] == "NCHW":
            run = mc.launch(mod, f"act_bwd_planes<{block},{vec}>", (c, s), block)
            dims = run.consts(np.int64(n // (c * inner)), np.int32(c), np.int32(inner))
        else:
            tx = min(c // vec, block)
            run = mc.launch(mod, f"act_bwd_rows<{block},{vec}>", (s, mc.cdiv(c // vec, tx)),
                            block, 4 * block * vec)
            dims = run.consts(np.int64(n // c), np.int32(c))
        fin = mc.launch(mod, "act_bwd_finish", mc.cdiv(c, 128), 128)
        fdims = fin.consts(np.int32(s), np.int32(c))

        def go(dy: Any, x: Any, b: Any, dx: Any, db: Any, slope: float) -> None:
            run((dy, x, b, dx, part, *dims, run.f32(slope)))
            fin((part, *fdims, db))

        return go
