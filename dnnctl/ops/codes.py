"""The numeric codes the Python side hands the CUDA side, one table each.

* :data:`DTYPE` — ``-DDNNCTL_DTYPE`` (kernels/include/dnnctl/common.cuh picks the element type);
* :data:`ACT` — ``dnnctl::Act`` (common.cuh), the activation of every fused epilogue;
* :data:`BIAS_MODE` / :data:`OUT_MODE` — ``dnnctl::BiasMode`` / ``dnnctl::OutMode``
  (epilogue.cuh), the ``-DEPI_BIAS`` / ``-DEPI_OUT`` of the GEMM and implicit-GEMM kernels;
* :data:`EPI_FLAG` — ``dnnctl::conv::EpiFlag`` (conv.cuh), the run-time epilogue bits of the
  element-wise conv kernels (direct, depthwise, FFT);
* :data:`CUDA_R` / :data:`CUBLAS_COMPUTE` / :data:`CUBLAS_OP` — cudaDataType_t,
  cublasComputeType_t and cublasOperation_t values (cuda's library_types.h, cublas_api.h).

tests/unit/test_codes.py checks DTYPE, ACT and the epilogue tables against the headers, so the two sides cannot drift.
"""

from __future__ import annotations

DTYPE: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2}

ACT: dict[str, int] = {"none": 0, "relu": 1, "leaky_relu": 2, "gelu": 3, "gelu_tanh": 4,
                       "silu": 5, "sigmoid": 6, "tanh": 7, "relu6": 8, "hardswish": 9,
                       "hardsigmoid": 10}

BIAS_MODE: dict[str, int] = {"none": 0, "col": 1, "row": 2}
OUT_MODE: dict[str, int] = {"store": 0, "partial": 1, "atomic": 2, "fused": 3}
EPI_FLAG: dict[str, int] = {"bias": 1, "residual": 2, "res_before_act": 4}
# EPI_RES of the GEMM-core kernels (dnnctl::ResMode, epilogue.cuh)
RES_MODE: dict[str, int] = {"none": 0, "after_act": 1, "before_act": 2}

CUDA_R: dict[str, int] = {"float32": 0, "float16": 2, "complex64": 4, "bfloat16": 14}
CUBLAS_COMPUTE: dict[str, int] = {"32F": 68, "32F_FAST_TF32": 77}
CUBLAS_OP: dict[str, int] = {"N": 0, "T": 1}
