// The strip of a depthwise NHWC thread (kernels/conv2d/depthwise.cu, depthwise_tile.cu): TQ
// adjacent output columns of one output row x NV adjacent channels. Per filter row the thread
// reads the SPAN input columns its outputs touch once; strip_fma feeds input column j to every
// (output t, tap s) pair that reads it (resolved at compile time once the column loop is
// unrolled), strip_store runs the conv2d epilogue and writes the TQ outputs.
// Include after <dnnctl/conv.cuh> and <dnnctl/depthwise_filter.cuh>.
#pragma once
#include <dnnctl/conv.cuh>
#include <dnnctl/depthwise_filter.cuh>

namespace dnnctl {

// Is input column j of a TQ-output strip read by some (output t, tap s)?
template <int TQ_>
__device__ __forceinline__ constexpr bool strip_column_used(int j) {
  for (int t = 0; t < TQ_; ++t)
    for (int s = 0; s < KS; ++s)
      if (t * STR_W + s * DIL_W == j) return true;
  return false;
}

// acc[t] += xv * wr[s] for every (output t, tap s) of the strip that reads column j.
template <int TQ_, int NV>
__device__ __forceinline__ void strip_fma(float (&acc)[TQ_][NV], const float (&xv)[NV],
                                          const float (&wr)[KS][NV], int j) {
#pragma unroll
  for (int t = 0; t < TQ_; ++t)
#pragma unroll
    for (int s = 0; s < KS; ++s)
      if (t * STR_W + s * DIL_W == j) {
#pragma unroll
        for (int v = 0; v < NV; ++v) acc[t][v] = fmaf(xv[v], wr[s][v], acc[t][v]);
      }
}

// The epilogue of the strip's outputs (row `prow` = n * P + p, columns q0 .. q0 + TQ - 1 below
// Q, channels k0 .. k0 + NV - 1 of K) and their NV-wide stores.
template <int TQ_, int NV>
__device__ __forceinline__ void strip_store(elem_t* __restrict__ y, const float (&acc)[TQ_][NV],
                                            long long prow, int q0, int Q, int K, int k0,
                                            const elem_t* __restrict__ bias,
                                            const elem_t* __restrict__ residual, int act,
                                            int flags) {
#pragma unroll
  for (int t = 0; t < TQ_; ++t) {
    const int q = q0 + t;
    if (q >= Q) break;
    const long long yi = (prow * Q + q) * K + k0;
    float out[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v)
      out[v] = conv::epilogue(acc[t][v], k0 + v, yi + v, bias, residual, act, flags);
    conv::store_vec<NV>(y + yi, out);
  }
}

}  // namespace dnnctl
