"""CUDA matmul variants: cuBLAS through CuPy, and our own tiled kernels (kernels/gemm/gemm.cu).

* ``cublas``: cublasGemmStridedBatchedEx with fp32 compute (TF32 when the key allows it);
  with bias / activation it writes the output dtype and our in-place epilogue kernel adds
  the bias and applies the activation (the product rounded before the epilogue, as torch's
  linear + activation rounds it).
* ``mma``: tensor cores (mma.sync m16n8k16 fp16/bf16; m16n8k8 TF32 for float32 with tf32),
  cp.async multi-stage pipeline, ldmatrix, fused epilogue; split-K with a deterministic
  two-pass reduction.
* ``mma_atomic``: the same with split-K partial sums added by fp32 atomics (not
  deterministic: the summation order varies run to run).
* ``simt``: exact fp32 with FFMA (float32 keys; the only one of ours that does not round
  inputs to TF32).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.backends import cublas
from dnnctl.errors import UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant, unsupported
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_COL,
    BIAS_NONE,
    MATH_MMA16,
    MATH_SIMT,
    MAX_GRID_Z,
    GemmDesc,
    GemmKernel,
    counter_elems,
    inplace_epilogue,
    make_gemm,
    math_for,
    ptr,
    split_plan,
    tile_config,
    tile_ok,
    workspace_elems,
)
from dnnctl.ops.matmul.op import ACT_CODES
from dnnctl.ops.registry import register_variant


def matmul_desc(p: Problem) -> GemmDesc:
    """The GemmDesc of a matmul problem (operands in their stored layouts)."""
    m, n, k = p["m"], p["n"], p["k"]
    ta, tb = p["trans_a"], p["trans_b"]
    return GemmDesc(
        dtype=p["dtype"], m=m, n=n, k=k, batch=p["batch"], a_kmajor=not ta, b_kmajor=tb,
        lda=m if ta else k, ldb=k if tb else n, ldc=n, sa=m * k, sb=k * n, sc=m * n,
        act=ACT_CODES[p["activation"]], bias_mode=BIAS_COL if p["bias"] else BIAS_NONE)


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def _pow2_at_least(x: int, lo: int, hi: int) -> int:
    v = lo
    while v < x and v < hi:
        v *= 2
    return v


class TiledGemmParams:
    """Parameter-space rules shared by the tiled GEMM variants (matmul and conv)."""

    simt: ClassVar[bool] = False
    atomic: ClassVar[bool] = False

    @staticmethod
    def space_ok(params: Mapping[str, Any], math_kind: int, dtype: str, m: int, n: int, k: int,
                 batch: int, device: Any, atomic: bool) -> bool:
        """Legal tile (warps, registers, shared memory) that makes sense for an M x N x K
        product: no tile twice the problem, split-K only while the grid underfills the GPU,
        each split at least two k-tiles, no more stages than k-tiles to prefetch."""
        cfg = tile_config(params, math_kind)
        if cfg is None or not tile_ok(cfg, dtype, device):
            return False
        if math_kind == MATH_SIMT and cfg.acc_per_thread > 64:
            return False  # FFMA tiles above 64 accumulators spill
        if cfg.bm > 32 and cfg.bm >= 2 * _round_up(m, 16):
            return False
        if cfg.bn > 64 and cfg.bn >= 2 * _round_up(n, 16):
            return False
        sms = getattr(device, "sm_count", 0) or 132
        tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
        if tiles >= 4 * sms and cfg.bm * cfg.bn < 64 * 64:
            return False  # plenty of work: small tiles only waste bandwidth
        ktiles = -(-k // cfg.bk)
        splitk = params["splitk"]
        if splitk > 1:
            if ktiles < 2 * splitk or tiles >= sms or batch * splitk > MAX_GRID_Z:
                return False
            if split_plan(k, cfg.bk, splitk)[1] != splitk:
                return False  # fewer effective splits: a duplicate of a smaller splitk
        elif atomic:
            return False
        per_split = -(-ktiles // splitk)
        return cfg.stages <= 2 or cfg.stages - 1 <= per_split

    @staticmethod
    def heuristic(math_kind: int, m: int, n: int, k: int, batch: int,
                  device: Any, atomic: bool) -> dict[str, Any]:
        """A sound configuration without tuning: 128 x 128 tiles on big products, tiles
        shrunk to skinny shapes, split-K until the GPU is covered (about three blocks per SM
        when M <= 64, where the product streams B from memory and more loads in flight pay)."""
        sms = getattr(device, "sm_count", 0) or 132
        if math_kind == MATH_SIMT:
            bm, bn, bk, warps, stages = 128, 64, 16, 4, 3
        else:
            bm = 128 if m >= 128 else _pow2_at_least(m, 16, 128)
            bn = 128 if n >= 128 else _pow2_at_least(n, 32, 128)
            bk = 64 if m <= 64 and math_kind == MATH_MMA16 else 32
            warps = 4
            stages = 4 if math_kind == MATH_MMA16 else 3
        tiles = -(-m // bm) * -(-n // bn) * batch
        ktiles = -(-k // bk)
        target, per_split = (3 * sms, 4) if m <= 64 else (sms, 8)
        splitk = 2 if atomic else 1
        while (splitk * 2 <= 16 and tiles * splitk * 2 <= target
               and ktiles >= per_split * splitk * 2):
            splitk *= 2
        return {"bm": bm, "bn": bn, "bk": bk, "warps": warps, "stages": stages,
                "splitk": splitk}


class CupyMatmul(Variant):
    """Base of the matmul variants on the cupy backend (ours and the vendors')."""

    op = "matmul"
    backend = "cupy"


class _TiledMatmul(TiledGemmParams, CupyMatmul):
    source = "gemm/gemm.cu"

    def _math(self, p: Problem) -> int:
        return math_for(p["dtype"], p["tf32"], self.simt)

    def supports(self, problem: Problem, device: Any) -> Support:
        if device.cc_tuple < (8, 0):
            return unsupported(f"needs compute capability >= 8.0 (cp.async, bf16 mma); "
                               f"{device.name} is {device.compute_capability}")
        dtype = problem["dtype"]
        if self.simt and dtype != "float32":
            return unsupported("simt is the fp32 FFMA kernel; fp16/bf16 use mma")
        if not self.simt and dtype == "float32" and not problem["tf32"]:
            return unsupported("float32 without tf32: tensor cores would round the inputs "
                               "to TF32; simt computes exact fp32 (or pass tf32=True)")
        if problem["batch"] > MAX_GRID_Z:
            return unsupported(f"batch {problem['batch']} exceeds the grid limit {MAX_GRID_Z}")
        if self.atomic and next(iter(self.param_space(problem, device)), None) is None:
            return unsupported("no split-K configuration pays off: the tile grid already "
                               "fills the GPU, or K has fewer than 4 k-tiles to split")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        p = problem
        if params.get("reduce") == "separate" and params["splitk"] == 1:
            return False  # nothing to reduce: only the fused (single kernel) form
        if params.get("pipe") == "overlap" and self._math(p) != MATH_MMA16:
            return False  # fp16 / bf16 fragments only (the tf32 loads would spill)
        return self.space_ok(params, self._math(p), p["dtype"], p["m"], p["n"], p["k"],
                             p["batch"], device, self.atomic)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        p = problem
        params = self.heuristic(self._math(p), p["m"], p["n"], p["k"], p["batch"], device,
                                self.atomic)
        if "reduce" in self.params:
            params["reduce"] = "fused"
        if "pipe" in self.params:
            params["pipe"] = "simple"
        return self.first_valid(p, device, [params])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        desc = matmul_desc(problem)
        slabs = workspace_elems(desc, params["bk"], params["splitk"], self.atomic)
        counters = 0
        if slabs and params.get("reduce") == "fused":
            counters = counter_elems(desc, params["bm"], params["bn"])
        return 4 * (slabs + counters)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        cfg = tile_config(params, self._math(problem))
        if cfg is None or not tile_ok(cfg, problem["dtype"], device):
            raise UnsupportedError(f"matmul/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        return GemmKernel(make_gemm(matmul_desc(problem), cfg, params["splitk"], self.atomic,
                                    device, fused=params.get("reduce") == "fused",
                                    overlap=params.get("pipe") == "overlap"))


_MMA_SPACE = {"bm": (16, 32, 64, 128, 256), "bn": (32, 64, 128, 256), "bk": (32, 64),
              "warps": (4, 8), "stages": (2, 3, 4, 5)}


@register_variant
class MmaMatmul(_TiledMatmul):
    """Our tensor-core GEMM (deterministic split-K: reduced in the kernel by the last split
    of each tile, or by a separate finish kernel; mainloop with or without fragment loads
    overlapped with the mma)."""

    name = "mma"
    params = {**_MMA_SPACE, "splitk": (1, 2, 4, 8, 16), "reduce": ("fused", "separate"),
              "pipe": ("simple", "overlap")}
    doc = ("tiled tensor-core GEMM: mma.sync (fp16/bf16, or tf32 for float32 with tf32), "
           "cp.async pipeline, ldmatrix, fused bias+activation, deterministic split-K")


@register_variant
class MmaAtomicMatmul(_TiledMatmul):
    """Our tensor-core GEMM with split-K partial sums added by fp32 atomics."""

    name = "mma_atomic"
    atomic = True
    deterministic = False
    params = {**_MMA_SPACE, "splitk": (2, 4, 8, 16)}
    doc = "tiled tensor-core GEMM, split-K reduced with fp32 atomics (not deterministic)"


@register_variant
class SimtMatmul(_TiledMatmul):
    """Our exact-fp32 FFMA GEMM."""

    name = "simt"
    simt = True
    params = {"bm": (32, 64, 128), "bn": (32, 64, 128), "bk": (8, 16, 32), "warps": (4, 8),
              "stages": (2, 3, 4), "splitk": (1, 2, 4, 8), "reduce": ("fused", "separate")}
    doc = "tiled fp32 FFMA GEMM (exact fp32), cp.async pipeline, fused epilogue, split-K"


# ----------------------------------------------------------------------------- cuBLAS

_CUDA_R = codes.CUDA_R
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = codes.CUBLAS_COMPUTE["32F"], codes.CUBLAS_COMPUTE["32F_FAST_TF32"]
_OP_N, _OP_T = codes.CUBLAS_OP["N"], codes.CUBLAS_OP["T"]
_GEMM_DEFAULT = -1


@register_variant
class CublasMatmul(CupyMatmul):
    """cuBLAS (dnnctl.backends.cublas) with our in-place epilogue kernel."""

    name = "cublas"
    vendor = True  # cuBLAS's GEMM; our epilogue kernel after it
    source = "gemm/epilogue.cu"
    doc = ("cublasGemmStridedBatchedEx (fp32 compute; TF32 if allowed) + our in-place "
           "bias / activation pass")

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["dtype"] == "bfloat16" and device.cc_tuple < (8, 0):
            return unsupported("cuBLAS bf16 GEMM needs compute capability >= 8.0")
        p = problem
        if max(p["m"], p["n"], p["k"]) >= 2**31 or p["batch"] >= 2**31:
            return unsupported("cuBLAS takes 32-bit sizes")
        return SUPPORTED

    @staticmethod
    def _epilogue(p: Problem) -> bool:
        return p["bias"] or p["activation"] != "none"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        m, n, k, bt = p["m"], p["n"], p["k"], p["batch"]
        ta, tb = p["trans_a"], p["trans_b"]
        dt = _CUDA_R[p["dtype"]]
        compute = _COMPUTE_32F_FAST_TF32 if p["tf32"] else _COMPUTE_32F
        one_ptr = cublas.host_scalar(np.float32, 1.0)
        zero_ptr = cublas.host_scalar(np.float32, 0.0)
        # the product in the output dtype, then bias + activation in place over it: 3 passes
        # of the output's bytes, not an fp32 product written and read back (4 + 4 + 2 bytes
        # an fp16 element); rounded before the epilogue, as torch's linear + activation is
        fin_go = inplace_epilogue(p["dtype"], ACT_CODES[p["activation"]],
                                  BIAS_COL if p["bias"] else BIAS_NONE, m=m, n=n, batch=bt,
                                  s_bias=0, sm_count=device.sm_count or 132
                                  ) if self._epilogue(p) else None
        gemm = cublas.gemm_strided_batched
        op_b, op_a = _OP_T if tb else _OP_N, _OP_T if ta else _OP_N
        ld_b, ld_a = k if tb else n, m if ta else k

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            y = outputs["y"]
            # row-major C = A B is column-major C^T = B^T A^T: cuBLAS's "A" is our b
            gemm(op_b, op_a, n, m, k, one_ptr, ptr(inputs["b"]), dt, ld_b, k * n,
                 ptr(inputs["a"]), dt, ld_a, m * k, zero_ptr, ptr(y), dt, n, m * n,
                 bt, compute, _GEMM_DEFAULT)
            if fin_go is not None:
                fin_go(y, inputs.get("bias"))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        return kernel
