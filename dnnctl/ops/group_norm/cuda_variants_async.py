"""group_norm ``async_group``: groups staged in shared memory by cp.async, one DRAM pass.

A block takes ``gpb`` consecutive groups of one sample, copies them into shared memory with
every copy in flight at once, computes exact two-pass statistics per group from there and
writes the normalized values (kernels/norm/gn_async.cu): x is read from DRAM once and y
written once, the minimum traffic. The geometry is compiled in (one module per shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Problem, Support, dtype_size, unsupported
from dnnctl.ops.group_norm.cuda_variants import _GnCuda
from dnnctl.ops.group_norm.op import gn_vec_ok
from dnnctl.ops.registry import register_variant


@register_variant
class GnAsyncGroup(_GnCuda):
    name = "async_group"
    source = "norm/gn_async.cu"
    doc = ("a block per gpb groups staged in shared memory by cp.async (one DRAM read), "
           "two-pass statistics from shared memory, normalize")
    params = {"block": (256, 512, 1024), "vec": mc.VECS, "gpb": (1, 2, 4)}

    def staged_bytes(self, problem: Problem, gpb: int) -> int:
        return gpb * self.group_size(problem) * dtype_size(problem["dtype"])

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        gpb, block = params["gpb"], params["block"]
        return (gn_vec_ok(problem, params["vec"]) and problem["groups"] % gpb == 0
                and self.staged_bytes(problem, gpb) + 1024 <= mc.smem_limit(device)
                and (block == 256 or block // 2 * params["vec"] < self.group_size(problem)))

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["n"] * problem["groups"] >= 2**31:
            return unsupported("2^31 groups or more")
        if self.staged_bytes(problem, 1) + 1024 > mc.smem_limit(device):
            return unsupported(f"a group of {self.staged_bytes(problem, 1)} bytes does not fit "
                               "in shared memory: use block_group or split_group")
        return SUPPORTED

    def defines(self, problem: Problem) -> dict[str, Any]:
        c, g = problem["c"], problem["groups"]
        return {**_GnCuda.defines(self, problem), "CH": c, "HW": problem["h"] * problem["w"],
                "CPG": c // g, "GROUPS": g}

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, gpb = params["block"], params["gpb"]
        mod = self.compile(problem, params, device, lambda v: f"gn_async<{block},{v},{gpb}>")
        run = mc.launch(mod, f"gn_async<{block},{vec},{gpb}>",
                        problem["n"] * problem["groups"] // gpb, block,
                        self.staged_bytes(problem, gpb))

        def go(x: Any, y: Any, w: Any, b: Any, eps: Any) -> None:
            run((x, y, w, b, run.f32(eps)))

        return go
