// Shared pieces of the softmax kernels (kernels/softmax/*.cu).
// Defines: DNNCTL_DTYPE, LOG (0: softmax, 1: log_softmax). Rows are contiguous, cols long.
// NaN/inf follow the two-pass formula exp(x - max) / sum: a NaN or +inf anywhere in a row
// makes the whole row NaN, a -inf element gives 0 (log: -inf), an all -inf row is NaN.
#pragma once
#include <dnnctl/memory.cuh>

#ifndef LOG
#define LOG 0
#endif

namespace dnnctl {

// The per-row constant of the output: 1 / sum (softmax) or log(sum) (log_softmax).
__device__ __forceinline__ float softmax_scale(float s) { return LOG ? logf(s) : 1.f / s; }

// Output for one element from x, the row max m and softmax_scale r.
__device__ __forceinline__ float softmax_out(float x, float m, float r) {
  return LOG ? (x - m) - r : fast_exp(x - m) * r;
}

// Online (max, sum) of one vector folded into a running partial: one exp per element plus
// one rescale per vector.
template <int VEC>
__device__ __forceinline__ void maxsum_add_vec(MaxSum& a, const float (&f)[VEC]) {
  float vm = f[0];
#pragma unroll
  for (int i = 1; i < VEC; ++i) vm = fmaxf(vm, f[i]);
  float vs = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) vs += f[i] == -DNNCTL_INF ? 0.f : fast_exp(f[i] - vm);
  a = maxsum_combine(a, MaxSum{vm, vs});
}

// Block-wide combination of per-thread partials: every thread gets the row (max, scale).
template <int NWARPS>
__device__ __forceinline__ MaxSum block_maxsum(const MaxSum& a, float* red) {
  const float m = block_max<NWARPS>(a.m, red);
  const float s = block_sum<NWARPS>(maxsum_rescale(a, m), red);
  return MaxSum{m, s};
}

}  // namespace dnnctl
