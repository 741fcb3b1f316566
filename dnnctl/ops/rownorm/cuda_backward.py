"""CUDA row-norm backward variants (``bwd_partials``, ``bwd_colpass``, ``bwd_stream``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _memory_rows as mr
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.registry import register_variant
from dnnctl.ops.rownorm.backward import MAX_ELEMS


class _RowNormBwdCuda(mc.CudaBackward):
    source = "norm/row_backward.cu"
    rms = False
    part = 0
    params = {"block": (128, 256, 512, 1024), "tpr": (1, 2, 4, 8, 16, 32, 128, 256, 512, 1024),
              "vec": mc.VECS, "waves": (1, 2, 4)}

    def nv(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return mc.cdiv(problem["cols"], params["tpr"] * vec)

    def vec_valid(self, problem: Problem, vec: int) -> bool:
        return mc.vec_fits(problem["dtype"], vec) and problem["cols"] % vec == 0

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        tpr, block, vec = params["tpr"], params["block"], params["vec"]
        if tpr > 32 and tpr != block:
            return False
        if not self.part and params["waves"] != 2:
            return False  # waves only size the partials grid
        return (self.vec_valid(problem, vec) and tpr <= block
                and self.nv(problem, params, vec) * vec <= MAX_ELEMS
                and (tpr == 1 or (tpr // 2) * vec < problem["cols"]))

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["cols"] > 1024 * MAX_ELEMS:
            return unsupported(f"rows longer than {1024 * MAX_ELEMS} do not fit a block's "
                               "registers")
        if problem["rows"] >= 2**31:
            return unsupported("2^31 rows or more")
        return SUPPORTED

    def defines(self, problem: Problem) -> dict[str, Any]:
        return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "RMS": int(self.rms),
                "HAS_W": int(problem["weight"]), "HAS_B": int(problem.get("bias", False))}

    def groups(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        rpb = params["block"] // params["tpr"]
        blocks = mc.cdiv(problem["rows"], rpb)
        if self.part:
            blocks = min(blocks, mc.sm_count(device) * params["waves"])
        return blocks

    def splits(self, problem: Problem, device: Any) -> int:
        return max(1, min(mc.cdiv(problem["rows"], 32),
                          mc.cdiv(4 * mc.sm_count(device), mc.cdiv(problem["cols"], 32))))

    def partial_rows(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        if self.part:
            return self.groups(problem, params, device) * (params["block"] // params["tpr"])
        return self.splits(problem, device)

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 8 * problem["cols"] * self.partial_rows(problem, params, None)

    def row_kernel(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return (f"norm_bwd_rows<{params['block']},{params['tpr']},{vec},"
                f"{self.nv(problem, params, vec)},{self.part}>")

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        rows, cols = problem["rows"], problem["cols"]
        block = params["block"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        names = [self.row_kernel(problem, params, v) for v in dict.fromkeys((vec, 1))]
        grads = problem["weight"] or problem.get("bias", False)
        names += ["norm_bwd_cols<256>", "norm_bwd_finish"]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        nparts = self.partial_rows(problem, params, device)
        part = mc.workspace(device, 8 * cols * nparts)
        grid = self.groups(problem, params, device)
        finish = mc.launch(mod, "norm_bwd_finish", mc.cdiv(cols, 128), 128)
        fdims = finish.consts(np.int32(nparts), np.int32(cols))
        per = mc.cdiv(rows, nparts)
        colpass = mc.launch(mod, "norm_bwd_cols<256>", (mc.cdiv(cols, 32), nparts), 256)
        cdims = colpass.consts(np.int32(rows), np.int32(cols), np.int32(per))
        use_cols = grads and not self.part
        use_finish = grads

        def program(v: int) -> mr.Program:
            rowk = mc.launch(mod, self.row_kernel(problem, params, v), grid, block)
            dims = rowk.consts(np.int32(rows), np.int32(cols))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                dy, x, w, mean, rstd, dx, dw, db = arrs
                rowk((dy, x, w, mean, rstd, dx, part, *dims))
                if use_cols:
                    colpass((dy, x, mean, rstd, part, *cdims))
                if use_finish:
                    finish((part, *fdims, dw, db))

            return go

        return mr.RowKernel(program(vec), program(1), vec * mc.dtype_size(problem["dtype"]),
                            _arrays)


class _RowNormBwdStream(_RowNormBwdCuda):
    """Any length: a block per row reading it twice; the column pass for the parameters."""

    params = {"block": (256, 512, 1024), "vec": mc.VECS}

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self.vec_valid(problem, params["vec"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["rows"] >= 2**31:
            return unsupported("2^31 rows or more")
        return SUPPORTED

    def groups(self, problem: Problem, params: Mapping[str, Any], device: Any) -> int:
        return problem["rows"]

    def row_kernel(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return f"norm_bwd_stream<{params['block']},{vec}>"


def _arrays(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
    return (inputs["dy"], inputs["x"], inputs.get("weight"), inputs.get("mean"),
            inputs["rstd"], outputs["dx"], outputs.get("dweight"), outputs.get("dbias"))


_DOCS = {"bwd_partials": "dx, and dweight / dbias partials per row group in registers "
                         "(groups stride over rows), then a column sum of the partials",
         "bwd_colpass": "dx a row per group, then a column-parallel pass over dy and x for "
                        "dweight / dbias, then a column sum of the split partials",
         "bwd_stream": "any length: a block per row reading it twice, then the column pass "
                       "for dweight / dbias"}

for _op in ("layer_norm", "rms_norm"):
    for _name, _part in (("bwd_partials", 1), ("bwd_colpass", 0), ("bwd_stream", 0)):
        register_variant(type(
            f"{''.join(p.title() for p in _op.split('_'))}{_name.title().replace('_', '')}",
            (_RowNormBwdStream if _name == "bwd_stream" else _RowNormBwdCuda,),
            {"op": _op, "name": _name, "part": _part, "doc": _DOCS[_name],
             "rms": _op == "rms_norm", "__module__": __name__}))
