// dnnctl shared device helpers: element types, conversions, activations.
// NVRTC-compatible (no host headers). Kernels include it as <dnnctl/common.cuh>.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace dnnctl {

// ---- element type selected at compile time: -DDNNCTL_DTYPE=0|1|2 (float, half, bf16)
#ifndef DNNCTL_DTYPE
#define DNNCTL_DTYPE 0
#endif
#if DNNCTL_DTYPE == 0
typedef float elem_t;
#elif DNNCTL_DTYPE == 1
typedef __half elem_t;
#else
typedef __nv_bfloat16 elem_t;
#endif

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- activations (computed in fp32). ACT_* codes match dnnctl.ops activation names.
enum Act { ACT_NONE = 0, ACT_RELU = 1, ACT_LEAKY_RELU = 2, ACT_GELU = 3, ACT_GELU_TANH = 4,
           ACT_SILU = 5, ACT_SIGMOID = 6, ACT_TANH = 7, ACT_RELU6 = 8, ACT_HARDSWISH = 9,
           ACT_HARDSIGMOID = 10 };

template <int ACT>
__device__ __forceinline__ float activate(float x, float slope = 0.01f) {
  if (ACT == ACT_RELU) return x > 0.f ? x : (x != x ? x : 0.f);  // NaN propagates
  if (ACT == ACT_LEAKY_RELU) return x > 0.f ? x : x * slope;
  if (ACT == ACT_GELU) return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  if (ACT == ACT_GELU_TANH) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
  }
  if (ACT == ACT_SILU) return x / (1.f + __expf(-x));
  if (ACT == ACT_SIGMOID) return 1.f / (1.f + __expf(-x));
  if (ACT == ACT_TANH) return tanhf(x);
  // min(max(x, 0), 6) as torch's hardtanh: NaN propagates
  if (ACT == ACT_RELU6) return x != x ? x : fminf(fmaxf(x, 0.f), 6.f);
  if (ACT == ACT_HARDSWISH) return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
  if (ACT == ACT_HARDSIGMOID) return x != x ? x : fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
  return x;
}

}  // namespace dnnctl
