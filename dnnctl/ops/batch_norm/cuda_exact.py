"""batch_norm inference ``infer_exact``: the tensor as one exact-grid stream of vectors.

The activation kernels' fastest shape (one pass, grid sized to the tensor, UNROLL vectors per
thread) with the channel of each vector computed from its flat index (the geometry is
compiled in) and no per-block parameter prologue: every thread reads its channels' fp32
statistics itself, alongside its x loads (kernels/norm/bn_exact.cu).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.base import Kernel, Problem, Support, dtype_size, unsupported
from dnnctl.ops.batch_norm.cuda_variants import _BnCuda, _BnKernel
from dnnctl.ops.registry import register_variant


class _ExactKernel(mc.VecKernel):
    """The VEC program when x / y are VEC-aligned (and, NHWC, the fp32 parameter vectors are
    aligned for their vector loads); else the VEC = 1 program."""

    __slots__ = ("palign", "n")

    def __init__(self, fast: mc.Launch, safe: mc.Launch, align: int, palign: int,
                 n: Any) -> None:
        super().__init__(fast, safe, align)
        self.palign = palign
        self.n = fast.consts(n)[0]  # converted once for the launch

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        x, y = inputs["x"], outputs["y"]
        m, v = inputs["running_mean"], inputs["running_var"]
        w, b = inputs.get("weight"), inputs.get("bias")
        z = inputs.get("residual")
        ok = mc.aligned(self.align, x, y, z) and mc.aligned(self.palign, m, v, w, b)
        go = self.fast if ok else self.safe
        go((x, y, m, v, w, b, self.n, go.f32(attrs.get("eps", 1e-5)), z))


@register_variant
class BnInferExact(_BnCuda):
    name = "infer_exact"
    fused_epilogue = True
    source = "norm/bn_exact.cu"
    doc = ("exact-grid vector stream, channel from the flat index (geometry compiled in), "
           "statistics read per thread: no prologue")
    params = {"block": (128, 256, 512), "vec": mc.VECS, "unroll": (1, 2, 4)}

    def supports(self, problem: Problem, device: Any) -> Support:
        if mc.cdiv(sp.numel(problem), 128) >= 2**31:
            return unsupported("more than 2^31 blocks: use infer_flat")
        return _BnCuda.supports(self, problem, device)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        n = sp.numel(problem)
        itype = mc.index_type(n)
        block, unroll = params["block"], params["unroll"]
        vecs = self.vecs(problem, params, device)
        defines = {**self.defines(problem, 0), "CH": problem["c"],
                   "HW": problem["h"] * problem["w"]}

        def name(v: int) -> str:
            return f"bn_exact<{block},{v},{unroll},0,{itype}>"

        mod = mc.compile_cuda(self.source, defines, [name(v) for v in vecs], device)
        runs = [mc.launch(mod, name(v), max(1, mc.cdiv(n // v, block * unroll)), block)
                for v in (vecs[0], 1)]
        vec = vecs[0]
        palign = 4 * vec if problem["layout"] == "NHWC" else 4
        return _ExactKernel(runs[0], runs[1], vec * dtype_size(problem["dtype"]),
                            min(16, palign), mc.index_scalar(n, itype))


# ----------------------------------------------------------------------------- training


class _StreamKernel(_BnKernel):
    """Statistics, finalize, normalize; the VEC programs when x / y are VEC-aligned and the
    normalize's parameter vectors (save_mean, bias) allow its vector loads."""

    __slots__ = ("palign",)

    def __init__(self, fast: Any, safe: Any, align: int, palign: int) -> None:
        super().__init__(fast, safe, align, True)
        self.palign = palign

    def vector_ok(self, arrs: tuple) -> bool:
        return _BnKernel.vector_ok(self, arrs) and mc.aligned(self.palign, arrs[8], arrs[5])


NORM_BLOCK = 256  # the training variants' exact-grid normalize


def exact_name(problem: Problem, vec: int) -> str:
    """The training variants' normalize: bn_exact walking x backwards (what their statistics
    read last is still in L2), two vectors per thread."""
    return f"bn_exact<{NORM_BLOCK},{vec},2,1,{mc.index_type(sp.numel(problem))}>"


def exact_launch(mod: Any, problem: Problem, vec: int) -> tuple[mc.Launch, tuple]:
    """The launch of :func:`exact_name` and its size argument."""
    total = sp.numel(problem)
    norm = mc.launch(mod, exact_name(problem, vec), max(1, mc.cdiv(total // vec, NORM_BLOCK * 2)),
                     NORM_BLOCK)
    return norm, norm.consts(mc.index_scalar(total, mc.index_type(total)))


class _StreamBuild:
    """The training variants' programs end with the exact-grid normalize, whose parameter
    vectors need their own alignment (:class:`_StreamKernel`)."""

    def wrap(self, problem: Problem, vec: int, fast: Any, safe: Any) -> Kernel:
        palign = min(16, 4 * vec) if problem["layout"] == "NHWC" else 4
        return _StreamKernel(fast, safe, vec * dtype_size(problem["dtype"]), palign)


@register_variant
class BnTrainStream(_StreamBuild, _BnCuda):
    name = "train_stream"
    fused_epilogue = True
    source = "norm/bn_stream.cu"
    training = True
    doc = ("statistics with `unroll` loads in flight per thread, finalize, then the exact-grid "
           "normalize walking x backwards (what the statistics read last is still in L2)")
    params = {"block": (128, 256, 512), "vec": mc.VECS, "waves": (2, 4, 8), "unroll": (2, 4)}

    def layout(self, problem: Problem, params: Mapping[str, Any], vec: int,
               sms: int) -> tuple[int, int, int]:
        """(splits, float offset of the mean, of the scale) in the workspace."""
        splits = sp.stats_splits(problem, params["block"], vec, params["waves"], sms)
        start = sp.pad4(3 * problem["c"] * splits)
        return splits, start, start + sp.pad4(problem["c"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        _, _, scale = self.layout(problem, params, params["vec"], 132)
        return 4 * (scale + problem["c"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if mc.cdiv(sp.numel(problem), 128) >= 2**31:
            return unsupported("more than 2^31 blocks: use train_fused")
        return _BnCuda.supports(self, problem, device)

    def program(self, problem: Problem, params: Mapping[str, Any], vec: int,
                device: Any) -> Any:
        block, u = params["block"], params["unroll"]
        n, c, hw = problem["n"], problem["c"], problem["h"] * problem["w"]
        vecs = self.vecs(problem, params, device)
        nhwc = problem["layout"] == "NHWC"
        kind = "rows" if nhwc else "planes"

        def names(v: int) -> list[str]:
            return [f"bn_stats_{kind}_u<{block},{v},{u}>", exact_name(problem, v)]

        defines = {**self.defines(problem, 1), "CH": c, "HW": hw}
        mod = mc.compile_cuda(self.source, defines, [m for v in vecs for m in names(v)],
                              device)
        fin_mod = mc.compile_cuda("norm/bn_train.cu", self.defines(problem, 1),
                                  ["bn_finalize<0>"], device)
        splits, m_off, s_off = self.layout(problem, params, vec, mc.sm_count(device))
        if nhwc:
            tx = min(c // vec, block)
            stats = mc.launch(mod, names(vec)[0], (splits, mc.cdiv(c // vec, tx)), block,
                              12 * block * vec)
            stat_args: tuple = stats.consts(np.int64(n * hw))
        else:
            nv = hw // vec
            parts = max(1, mc.cdiv(nv, block * 8))
            stats = mc.launch(mod, names(vec)[0], (c, splits), block)
            stat_args = stats.consts(np.int32(n), np.int32(parts), np.int32(mc.cdiv(nv, parts)))
        fin = mc.launch(fin_mod, "bn_finalize<0>", mc.cdiv(c, 128), 128)
        norm, size = exact_launch(mod, problem, vec)
        ws = mc.workspace(device, 4 * (s_off + c))
        part, ws_mean, ws_scale = ws[:3 * c * splits], ws[m_off:m_off + c], ws[s_off:s_off + c]
        dims = fin.consts(np.int32(splits), np.int32(c))

        def go(arrs: tuple, eps: Any, momentum: Any) -> None:
            x, y, rm, rv, w, b, nrm, nrv, smean, sinv, z = arrs
            stats((x, part, *stat_args))
            fin((part, *dims, rm, rv, nrm, nrv, smean, sinv, w, ws_mean, ws_scale, eps,
                 momentum))
            norm((x, y, smean, ws_scale, w, b, *size, eps, z))

        return go
