"""conv2d wgrad as an implicit GEMM on tensor cores with split-K over N*P*Q
(kernels/conv2d/wgrad_implicit_gemm.cu), NHWC.

dw_g = dy_g^T @ col_g with the patch matrix gathered on the fly. The reduction (N*P*Q, up to
millions of pixels) is long and the output (K x R*S*C/g) small, so the GPU is filled by
splitting the pixels: ``wgrad_implicit_gemm`` stores one fp32 slab per split and sums them
in split order (deterministic: bitwise repeatable; workspace splits * |w| floats, bounded by
MAX_WORKSPACE), ``wgrad_implicit_gemm_atomic`` adds the splits into one zeroed slab with
fp32 atomics (|w| floats whatever the split; the order, hence the rounding, varies run to
run). db, when asked for, is dy's column sum (deterministic, kernels/conv2d/bias_grad.cu).
Parameters as the forward implicit_gemm, with splits up to 256.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_backward import bias_grad, wgrad_workspace
from dnnctl.ops.conv2d.cuda_base import Workspace
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.conv2d.tiled import (
    TiledConv,
    gather_dims,
    groups_unsupported,
    split_k,
    tile_defines,
)
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_NONE,
    DTYPE_CODES,
    ELEM_BYTES,
    OUT_ATOMIC,
    OUT_PARTIAL,
    OUT_STORE,
    aligned,
    array_dtype,
    finish_kernel,
    finish_launch,
    load_kernel,
    vec_for,
)
from dnnctl.ops.registry import register_variant

MAX_WORKSPACE = 256 << 20  # deterministic split-K slabs stay under 256 MiB


def gemm_dims(g: ConvGeom) -> tuple[int, int, int]:
    """(M, N, K) of one group's GEMM: Kg, R*S*Cg, N*P*Q."""
    return g.kg, g.r * g.s * g.cg, g.npq


def gather_vec(g: ConvGeom) -> int:
    """GEMM_VEC_B of the pixel gather: channels per copy (a power of two dividing Cg)."""
    return vec_for(g.cg, ELEM_BYTES[g.dtype])


def gather_fits(threads: int, bn: int, vec: int) -> bool:
    """PixelGather's static constraint (kernels/conv2d/wgrad_implicit_gemm.cu), same
    arithmetic: the BN / VEC column slots of a B tile map onto whole threads
    (CPR = BN / VEC divides NT, so RSTEP = NT / CPR >= 1 rows per step)."""
    if bn % vec:
        return False
    cpr = bn // vec
    return cpr > 0 and threads % cpr == 0


class _WgradGemm(TiledConv):
    passes = ("wgrad",)
    source = "conv2d/wgrad_implicit_gemm.cu"
    atomic: ClassVar[bool] = False
    params: ClassVar[dict[str, tuple[Any, ...]]] = dict(
        TiledConv.params, splitk=(1, 2, 4, 8, 16, 32, 64, 128, 256))

    def geom_unsupported(self, g: ConvGeom, device: Any) -> Support | None:
        if not g.nhwc:
            return unsupported("NHWC only (the pixel gather copies channel vectors)")
        no = groups_unsupported(g, "one channel per group; use wgrad_depthwise")
        if no is not None:
            return no
        if self.atomic and not any(True for _ in self._space(g, device)):
            m, n, k = gemm_dims(g)
            why = (f"N*P*Q = {k} pixels is too short to split in two (>= 2 k-tiles each)"
                   if -(-k // min(self.params["bk"])) < 4 else
                   f"the {m} x {n} output's tiles already fill the GPU, so no split pays")
            return unsupported(f"split-K by atomics only: {why}; use wgrad_implicit_gemm")
        return None

    def _splits(self, g: ConvGeom, bk: int, splitk: int) -> tuple[int, int]:
        return split_k(g.npq, bk, splitk)

    def slab_elems(self, g: ConvGeom, splits: int) -> int:
        m, n, _ = gemm_dims(g)
        if splits == 1:
            return 0
        return (1 if self.atomic else splits) * g.groups * m * n

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self._valid(geometry(problem), params, device)

    def _valid(self, g: ConvGeom, params: Mapping[str, Any], device: Any) -> bool:
        m, n, k = gemm_dims(g)
        if not self.space_ok(params, self._math(g), g.dtype, m, n, k, g.groups, device,
                             self.atomic):
            return False
        if not gather_fits(params["warps"] * 32, params["bn"], gather_vec(g)):
            return False
        _, splits = self._splits(g, params["bk"], params["splitk"])
        return 4 * self.slab_elems(g, splits) <= MAX_WORKSPACE

    def param_space(self, problem: Problem, device: Any) -> Iterator[dict[str, Any]]:
        return self._space(geometry(problem), device)

    def _space(self, g: ConvGeom, device: Any) -> Iterator[dict[str, Any]]:
        return self.declared_space(lambda cand: self._valid(g, cand, device))

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        m, n, k = gemm_dims(g)
        params = self.heuristic(self._math(g), m, n, k, g.groups, device, self.atomic)
        sms = int(getattr(device, "sm_count", 0) or 132)
        tiles = -(-m // params["bm"]) * -(-n // params["bn"]) * g.groups
        ktiles = -(-k // params["bk"])
        while (params["splitk"] < 256 and tiles * params["splitk"] * 2 <= 2 * sms
               and ktiles >= 16 * params["splitk"]):
            params["splitk"] *= 2
        # a split count the pixels do not divide into evenly (split_plan gives fewer
        # effective splits) is not in the space: step down to the largest one that is
        splits = [s for s in self.params["splitk"] if s <= params["splitk"]][::-1]
        return self.first_valid(problem, device, (
            dict(params, stages=stages, splitk=splitk)
            for stages in dict.fromkeys((params["stages"], 3)) for splitk in splits))

    def workspace(self, g: ConvGeom, splits: int) -> Workspace:
        return wgrad_workspace(g, ("slab", self.slab_elems(g, splits), np.float32))

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        g = geometry(problem)
        _, splits = self._splits(g, params["bk"], params["splitk"])
        return self.workspace(g, splits).nbytes

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        cfg = self.tile(g, params, device)
        m, n, _ = gemm_dims(g)
        kchunk, splits = self._splits(g, cfg.bk, params["splitk"])
        eb = ELEM_BYTES[g.dtype]
        vec_a, vec_b = vec_for(g.kg, eb), gather_vec(g)
        if not gather_fits(cfg.threads, cfg.bn, vec_b):
            raise UnsupportedError(
                f"conv2d/{self.name}: bn={cfg.bn} with {vec_b}-channel copies (Cg={g.cg}) "
                f"needs {cfg.bn // vec_b} threads per pixel row, more than the block's "
                f"{cfg.threads}; use more warps or a narrower bn")
        out = OUT_STORE if splits == 1 else (OUT_ATOMIC if self.atomic else OUT_PARTIAL)
        defines = {"DNNCTL_DTYPE": DTYPE_CODES[g.dtype], **tile_defines(cfg, vec_a, vec_b),
                   "EPI_OUT": out, "EPI_PAIR": int(n % 2 == 0)}
        smem = cfg.smem_bytes(g.dtype)
        main = mc.Launch(load_kernel(self.source, "conv_wgrad_implicit_gemm", defines, smem),
                         (-(-m // cfg.bm) * -(-n // cfg.bn), 1, g.groups * splits),
                         (cfg.threads, 1, 1), smem)
        dims = main.consts(*gather_dims(g, g.c, splits, kchunk))
        fin = None if out == OUT_STORE else finish_launch(
            finish_kernel(g.dtype, 0, BIAS_NONE, False, 0), m=m, n=n, batch=g.groups,
            splits=1 if self.atomic else splits, ldc=n, sc=m * n, s_bias=0,
            sm_count=device.sm_count or 132)
        ws = self.workspace(g, splits)
        xp = get_backend("cupy").xp
        rt = _cuda.runtime()
        db = bias_grad(rt, g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x = aligned(inputs["x"], vec_b * eb)
            dy = aligned(inputs["dy"], vec_a * eb)
            dw = outputs["dw"]
            # the epilogue (or the finish) stores column pairs: a misaligned view of dw
            # (DLPack) gets an aligned temporary
            dw_out = dw if mc.aligned(2 * eb, dw) else cuda.scratch(tuple(dw.shape),
                                                                       array_dtype(dw))
            buf = ws.allocate(xp)
            slab = buf["slab"] if out != OUT_STORE else None
            if self.atomic and slab is not None:
                slab[...] = 0
            main((x, dy, dw_out, slab, *dims))
            if fin is not None:
                fin(slab, dw_out, dw_out, dw_out)
            if dw_out is not dw:
                cuda.copy(dw, dw_out)
            db(inputs, outputs, buf)

        return kernel


@register_variant
class WgradImplicitGemm(_WgradGemm):
    """wgrad implicit GEMM, split-K over N*P*Q with a fixed-order (deterministic) sum."""

    name = "wgrad_implicit_gemm"
    doc = ("wgrad: dy^T @ gathered patches on tensor cores, split-K over N*P*Q, fp32 slabs "
           "summed in split order (deterministic); db")


@register_variant
class WgradImplicitGemmAtomic(_WgradGemm):
    """wgrad implicit GEMM, split-K over N*P*Q added by fp32 atomics (not deterministic)."""

    name = "wgrad_implicit_gemm_atomic"
    atomic = True
    deterministic = False
    doc = ("wgrad: dy^T @ gathered patches on tensor cores, split-K over N*P*Q by fp32 "
           "atomics into one slab (run-to-run rounding varies); db")
