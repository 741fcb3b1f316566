"""The numeric codes the Python side hands the CUDA side, one table each.

* :data:`DTYPE` — ``-DDNNCTL_DTYPE`` (kernels/include/dnnctl/common.cuh picks the element type);
* :data:`ACT` — ``dnnctl::Act`` (common.cuh), the activation of every fused epilogue;
* :data:`CUDA_R` / :data:`CUBLAS_COMPUTE` / :data:`CUBLAS_OP` — cudaDataType_t,
  cublasComputeType_t and cublasOperation_t values (cuda's library_types.h, cublas_api.h).

tests/unit/test_codes.py checks DTYPE and ACT against the header, so the two sides cannot drift.
"""

from __future__ import annotations

DTYPE: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2}

ACT: dict[str, int] = {"none": 0, "relu": 1, "leaky_relu": 2, "gelu": 3, "gelu_tanh": 4,
                       "silu": 5, "sigmoid": 6, "tanh": 7}

CUDA_R: dict[str, int] = {"float32": 0, "float16": 2, "complex64": 4, "bfloat16": 14}
CUBLAS_COMPUTE: dict[str, int] = {"32F": 68, "32F_FAST_TF32": 77}
CUBLAS_OP: dict[str, int] = {"N": 0, "T": 1}
