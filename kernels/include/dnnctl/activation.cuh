// Shared body of the activation kernels (kernels/activation/*.cu).
// Defines: DNNCTL_DTYPE, ACT_FN (dnnctl::Act code), BIAS (0 none, 1 channel = axis 1 (NCHW),
// 2 channel = last axis (NHWC)), INPLACE (1: x and y may be the same memory).
#pragma once
#include <dnnctl/memory.cuh>

#ifndef ACT_FN
#define ACT_FN 1
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef INPLACE
#define INPLACE 0
#endif

#if INPLACE
// each element is read and then written by the same thread: no restrict, no read-only cache
#define DNNCTL_RESTRICT
#define DNNCTL_XLOAD dnnctl::LD_PLAIN
#else
#define DNNCTL_RESTRICT __restrict__
#define DNNCTL_XLOAD dnnctl::LD_NC
#endif

// The parameters of both forward entries (kernels/activation/{exact_grid,grid_stride}.cu,
// templates over the index type I), in the order the host passes them: x, the channel bias
// (with BIAS), y, the element count, the channel's inner extent and the channel count, the
// leaky_relu slope.
#define ACT_PARAMS                                                      \
  const elem_t* DNNCTL_RESTRICT x, const elem_t* DNNCTL_RESTRICT bias, \
      elem_t* DNNCTL_RESTRICT y, I n, I inner, I C, float slope

namespace dnnctl {

// GELU's Phi(x) = 0.5 erfc(-x / sqrt 2) from erfc(|z|) by Numerical Recipes' erfcc (a
// Chebyshev fit with relative error < 1.2e-7 for every z >= 0): branch-free, about 16
// instructions (erfcf is ~75, which would make GELU compute-bound on 16-bit data), and no
// cancellation for negative x, where 1 + erf(x / sqrt 2) loses all relative accuracy.
__device__ __forceinline__ float gelu_erf(float x) {
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = rcp_approx(1.f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float e = t * fast_exp(p - z * z);  // erfc(z)
  return x * (x >= 0.f ? 1.f - 0.5f * e : 0.5f * e);
}

// The activation in fp32. GELU-tanh as 0.5 x (1 + tanh u) = x / (1 + exp(-2u)) (no
// cancellation for negative x); silu / sigmoid with expf for fp32 I/O (see fast_exp);
// reciprocals by rcp.approx (rcp_approx: relative error < 2^-22, far below every tolerance).
template <int A>
__device__ __forceinline__ float act_eval(float x, float slope) {
  if (A == ACT_GELU) return gelu_erf(x);
  if (A == ACT_GELU_TANH) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x * rcp_approx(1.f + fast_exp(-2.f * u));
  }
  if (A == ACT_SILU) return x * rcp_approx(1.f + fast_exp(-x));
  if (A == ACT_SIGMOID) return rcp_approx(1.f + fast_exp(-x));
  return activate<A>(x, slope);
}

// Activation (with the channel bias added first) of VEC consecutive elements from flat index e.
// With a bias and VEC > 1 the host guarantees one channel per vector (NCHW: inner % VEC == 0)
// or VEC consecutive channels (NHWC: C % VEC == 0, bias 16-byte aligned as x and y are).
template <int VEC, typename I>
__device__ __forceinline__ void act_apply(float (&v)[VEC], const elem_t* bias, I e, I inner,
                                          I C, float slope) {
#if BIAS == 1
  const float b = to_float(bias[(e / inner) % C]);
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = act_eval<ACT_FN>(v[i] + b, slope);
#elif BIAS == 2
  float b[VEC];
  load_vec<LD_NC, VEC>(bias + e % C, b);
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = act_eval<ACT_FN>(v[i] + b[i], slope);
#else
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = act_eval<ACT_FN>(v[i], slope);
#endif
}

// UNROLL vectors per thread, BLOCK vectors apart (a warp's accesses stay contiguous); all the
// loads are issued before any store so UNROLL * 16 bytes per thread are in flight.
template <int BLOCK, int VEC, int UNROLL, typename I>
__device__ __forceinline__ void act_tile(const elem_t* DNNCTL_RESTRICT x,
                                         const elem_t* DNNCTL_RESTRICT bias,
                                         elem_t* DNNCTL_RESTRICT y, I base, I nvec, I inner,
                                         I C, float slope) {
  load_unrolled<UNROLL, VEC, DNNCTL_XLOAD>(x, (I)VEC, base, (I)BLOCK, nvec, [&](I k, auto& v) {
    act_apply<VEC>(v, bias, k * VEC, inner, C, slope);
    store_vec<ST_PLAIN, VEC>(y + k * VEC, v);
  });
}

// The n % VEC elements after the last whole vector, one per thread of the first block.
template <int VEC, typename I>
__device__ __forceinline__ void act_tail(const elem_t* DNNCTL_RESTRICT x,
                                         const elem_t* DNNCTL_RESTRICT bias,
                                         elem_t* DNNCTL_RESTRICT y, I n, I nvec, I inner, I C,
                                         float slope) {
  if (VEC == 1 || blockIdx.x != 0) return;
  const I e = nvec * VEC + threadIdx.x;
  if (threadIdx.x < VEC && e < n) {
    float v[1] = {to_float(x[e])};
    act_apply<1>(v, bias, e, inner, C, slope);
    y[e] = from_float<elem_t>(v[0]);
  }
}

}  // namespace dnnctl
