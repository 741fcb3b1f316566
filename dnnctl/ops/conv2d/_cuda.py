"""What the CUDA conv2d variants need from CuPy, behind one small object.

The variants compile kernels, launch them, call cuBLAS (strided batched GEMM, column-major
semantics exactly as cuBLAS defines them) and cuFFT (plans with advanced data layout) only
through :class:`CudaRuntime`. The default runtime is CuPy's; tests can install another one
with :func:`use_runtime` (e.g. one that runs the same kernels on a CPU emulation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dnnctl.backends import cublas, cuda
from dnnctl.errors import KernelLaunchError
from dnnctl.ops import codes
from dnnctl.ops.base import dtype_name
from dnnctl.ops.conv2d.geom import ACTIVATIONS

# CUDA data types (library_types.h) and cuBLAS enums, by value: stable ABI numbers.
CUDA_R_32F, CUDA_R_16F, CUDA_C_32F, CUDA_R_16BF = (codes.CUDA_R[t] for t in (
    "float32", "float16", "complex64", "bfloat16"))
CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C = 0, 1, 2
CUBLAS_COMPUTE_32F = codes.CUBLAS_COMPUTE["32F"]
CUBLAS_COMPUTE_32F_FAST_TF32 = codes.CUBLAS_COMPUTE["32F_FAST_TF32"]
CUBLAS_GEMM_DEFAULT = -1
CUFFT_R2C, CUFFT_C2R = 0x2A, 0x2C
CUFFT_FORWARD, CUFFT_INVERSE = -1, 1

DTYPE_CODE = codes.DTYPE  # -DDNNCTL_DTYPE
ACT_CODE = {a: codes.ACT[a] for a in ACTIVATIONS}
EPI_FLAG_BIAS, EPI_FLAG_RESIDUAL = codes.EPI_FLAG["bias"], codes.EPI_FLAG["residual"]
EPI_FLAG_RES_BEFORE_ACT = codes.EPI_FLAG["res_before_act"]


def cuda_type(dtype: Any) -> int:
    """cudaDataType of an array dtype (NumPy / CuPy, or torch's: a torch caller's tensors
    reach the pointer-only kernels as they are)."""
    name = dtype_name(dtype)
    table = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF,
             "complex64": CUDA_C_32F}
    if name not in table:
        raise KernelLaunchError(f"no cuBLAS type for dtype {name}")
    return table[name]


class CudaRuntime:
    """CuPy-backed runtime: NVRTC modules via the cupy backend, cuBLAS, cuFFT."""

    def __init__(self) -> None:
        from dnnctl.backends.registry import get_backend

        self.backend = get_backend("cupy")

    @property
    def xp(self) -> Any:
        return self.backend.xp

    def function(self, source: str, defines: Mapping[str, Any], name: str) -> Any:
        """A launchable ``fn(grid, block, args)`` of ``kernels/<source>`` built with defines."""
        mod = self.backend.compile_module(source, defines=dict(defines))
        return mod.get_function(name)

    def ptr(self, arr: Any) -> int:
        return int(cuda.ptr(arr))

    def gemm(self, transa: int, transb: int, m: int, n: int, k: int,
             a: Any, a_off: int, lda: int, stride_a: int,
             b: Any, b_off: int, ldb: int, stride_b: int,
             c: Any, c_off: int, ldc: int, stride_c: int,
             batch: int, compute: int, beta: float = 0.0) -> None:
        """cublasGemmStridedBatchedEx, column-major: C_i = op(A_i) op(B_i) + beta C_i.

        Offsets and strides count elements of each array's own dtype."""
        scalar = np.complex64 if str(c.dtype) == "complex64" else np.float32
        one, beta_s = cublas.host_scalar(scalar, 1.0), cublas.host_scalar(scalar, beta)
        cublas.gemm_strided_batched(
            transa, transb, m, n, k, one,
            self.ptr(a) + a_off * a.itemsize, cuda_type(a.dtype), lda, stride_a,
            self.ptr(b) + b_off * b.itemsize, cuda_type(b.dtype), ldb, stride_b,
            beta_s,
            self.ptr(c) + c_off * c.itemsize, cuda_type(c.dtype), ldc, stride_c,
            batch, compute, CUBLAS_GEMM_DEFAULT)

    def fft_plan(self, shape: Sequence[int], inembed: Sequence[int], istride: int, idist: int,
                 onembed: Sequence[int], ostride: int, odist: int, kind: int,
                 batch: int) -> Any:
        """A single-precision cuFFT plan with advanced data layout (cufftMakePlanMany)."""
        from cupy.cuda import cufft

        last = shape[-1] // 2 + 1 if kind == CUFFT_R2C else shape[-1]
        return cufft.PlanNd(list(shape), list(inembed), istride, idist, list(onembed),
                            ostride, odist, kind, batch, "C", -1, last)

    def fft_exec(self, plan: Any, src: Any, dst: Any, direction: int) -> None:
        plan.fft(src, dst, direction)


_OVERRIDE: list[Any] = []
_DEFAULT: list[CudaRuntime] = []


def runtime() -> Any:
    """The runtime the CUDA conv2d variants build against (CuPy unless overridden)."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    if not _DEFAULT:
        _DEFAULT.append(CudaRuntime())
    return _DEFAULT[0]


@contextlib.contextmanager
def use_runtime(rt: Any) -> Iterator[Any]:
    """Build (and run) CUDA conv2d variants against ``rt`` inside the block."""
    _OVERRIDE.append(rt)
    try:
        yield rt
    finally:
        _OVERRIDE.pop()


def gemm_rowmajor(rt: Any, m: int, n: int, k: int,
                  a: Any, a_off: int, lda: int, stride_a: int, a_trans: bool,
                  b: Any, b_off: int, ldb: int, stride_b: int, b_trans: bool,
                  c: Any, c_off: int, ldc: int, stride_c: int,
                  batch: int = 1, tf32: bool = False, b_conj: bool = False,
                  beta: float = 0.0) -> None:
    """Row-major C_i[m, n] (row stride ldc) = A_i[m, k] @ B_i[k, n], batched with strides.

    A_i is stored [m, k] (row stride lda), or [k, m] when ``a_trans``; B_i is stored [k, n],
    or [n, k] when ``b_trans`` (``b_conj`` conjugates it: the Hermitian transpose).
    cuBLAS is column-major, so this computes C^T = op(B)^T op(A)^T: a row-major [r, c] matrix
    is the column-major [c, r] one with the same leading dimension. ``beta`` 1 adds the
    product to C (accumulating the chunks of a reduction).
    """
    op_b = (CUBLAS_OP_C if b_conj else CUBLAS_OP_T) if b_trans else CUBLAS_OP_N
    if b_conj and not b_trans:
        raise KernelLaunchError("conjugating a non-transposed B is not expressible in cuBLAS")
    op_a = CUBLAS_OP_T if a_trans else CUBLAS_OP_N
    compute = CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 else CUBLAS_COMPUTE_32F
    args = (op_b, op_a, n, m, k, b, b_off, ldb, stride_b, a, a_off, lda, stride_a,
            c, c_off, ldc, stride_c, batch, compute)
    if beta:  # (runtimes written before beta existed take the plain call)
        rt.gemm(*args, beta=beta)
    else:
        rt.gemm(*args)


def grid1d(total: int, block: int, cap: int = 1 << 20) -> tuple[int, int, int]:
    """A 1-D grid for a grid-stride loop over ``total`` items."""
    return (max(1, min((total + block - 1) // block, cap)), 1, 1)


COLSUM_BLOCKS = 1024  # blocks of 256 threads the column sums aim for: ~8 per SM on a Hopper
COLSUM_MIN_ROWS = 256  # rows per chunk at least: 32 per thread, over the finish pass's cost


def colsum_split(rows: int, cols: int) -> tuple[int, int]:
    """(rows per chunk, chunks) of the deterministic column sums of a (rows, cols) gradient
    (kernels/conv2d/bias_grad.cu: a block per 32 columns and chunk). From the shape alone, so
    a shape's sum always has the same order: enough chunks for about COLSUM_BLOCKS blocks,
    each at least COLSUM_MIN_ROWS rows (a multiple of 8, the block's row lanes)."""
    col_blocks = -(-cols // 32)
    want = max(1, -(-COLSUM_BLOCKS // col_blocks))
    per = max(COLSUM_MIN_ROWS, -(-rows // want))
    per = -(-per // 8) * 8
    return per, max(1, -(-rows // per))


def epilogue_codes(g: Any) -> tuple[np.int32, np.int32]:
    """(act, flags) kernel arguments of ``g``'s epilogue."""
    flags = (EPI_FLAG_BIAS if g.bias else 0) | (EPI_FLAG_RESIDUAL if g.residual else 0) | (
        EPI_FLAG_RES_BEFORE_ACT if g.residual_before_act else 0)
    return np.int32(ACT_CODE[g.activation]), np.int32(flags)


def res_mode(g: Any) -> int:
    """EPI_RES of the GEMM-core kernels (dnnctl::ResMode) for ``g``'s residual."""
    if not g.residual:
        return codes.RES_MODE["none"]
    return codes.RES_MODE["before_act" if g.residual_before_act else "after_act"]


def epilogue_ptrs(g: Any, y: Any, inputs: Mapping[str, Any]) -> tuple[Any, Any]:
    """(bias, residual) kernel arguments; absent tensors are passed as ``y`` (a valid
    pointer the kernel never reads)."""
    return (inputs["bias"] if g.bias else y, inputs["residual"] if g.residual else y)


def epilogue_args(g: Any, y: Any, inputs: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(bias, residual, act, flags) kernel arguments (see :func:`epilogue_ptrs`)."""
    return (*epilogue_ptrs(g, y, inputs), *epilogue_codes(g))


def i32(*vals: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(v) for v in vals)


def needs_epilogue(g: Any) -> bool:
    return bool(g.bias or g.residual or g.activation != "none")
