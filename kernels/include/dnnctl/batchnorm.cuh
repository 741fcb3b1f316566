// batch_norm normalize kernels shared by kernels/norm/bn_channel.cu (inference) and
// kernels/norm/bn_train.cu (the last pass of training). y = (x - mean[c]) * scale[c] + beta[c].
// Defines: DNNCTL_DTYPE, AFFINE (0/1), PARAMS (0: scale = w * rsqrt(var + eps) from the
// running statistics; 1: scale given (the training finalize folds the weight in)).
// Parameter vectors are fp32 (C,).
#pragma once
#include <dnnctl/memory.cuh>

#ifndef AFFINE
#define AFFINE 1
#endif
#ifndef PARAMS
#define PARAMS 0
#endif

namespace dnnctl {

__device__ __forceinline__ void bn_params(const float* mean, const float* var_or_scale,
                                          const float* w, const float* b, float eps, int c,
                                          float& m, float& scale, float& beta) {
  m = mean[c];
  if (PARAMS == 0) {
    scale = rsqrtf(var_or_scale[c] + eps);
    if (AFFINE) scale *= w[c];
  } else {
    scale = var_or_scale[c];
  }
  beta = AFFINE ? b[c] : 0.f;
}

}  // namespace dnnctl

// The kernels are global templates (NVRTC name expressions resolve them without a namespace).
using namespace dnnctl;

// NCHW: grid (N*C planes, splits of a plane). A block's channel parameters live in registers.
// Host: hw % VEC == 0 and VEC-aligned x / y (else VEC = 1).
template <int BLOCK, int VEC, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
bn_planes(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* mean,
          const float* var_or_scale, const float* w, const float* b, int C, int hw,
          float eps) {
  const i64 plane = blockIdx.x;
  float m, scale, beta;
  bn_params(mean, var_or_scale, w, b, eps, (int)(plane % C), m, scale, beta);
  const int nv = hw / VEC;
  const int per = (nv + gridDim.y - 1) / gridDim.y;
  const int begin = blockIdx.y * per;
  const int end = min(nv, begin + per);
  const elem_t* xp = x + plane * hw;
  elem_t* yp = y + plane * hw;
  for (int k0 = begin + (int)threadIdx.x; k0 < end; k0 += BLOCK * UNROLL) {
    load_unrolled<UNROLL, VEC, LD_NC>(xp, (i64)VEC, k0, BLOCK, end, [&](int k, auto& v) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = (v[i] - m) * scale + beta;
      store_vec<ST_PLAIN, VEC>(yp + (i64)k * VEC, v);
    });
  }
}

// NHWC: x as M rows of C channels. A block is TX = min(C / VEC, BLOCK) channel-vector lanes by
// RB = BLOCK / TX rows; blocks stride over row tiles of RB * UNROLL. When C / VEC <= BLOCK a
// thread keeps one channel vector for its whole life and its parameters stay in registers.
// Host: C % VEC == 0 and VEC-aligned x / y (else VEC = 1).
template <int BLOCK, int VEC, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
bn_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* mean,
        const float* var_or_scale, const float* w, const float* b, i64 M, int C, float eps) {
  const int cvn = C / VEC;
  const int tx_n = min(cvn, BLOCK);
  const int rb = BLOCK / tx_n;
  const int tx = threadIdx.x % tx_n, ty = threadIdx.x / tx_n;
  if (ty >= rb) return;
  const i64 tile = (i64)rb * UNROLL;
  for (int cv = tx; cv < cvn; cv += tx_n) {
    float m[VEC], scale[VEC], beta[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      bn_params(mean, var_or_scale, w, b, eps, cv * VEC + i, m[i], scale[i], beta[i]);
    for (i64 r0 = (i64)blockIdx.x * tile + ty; r0 < M; r0 += (i64)gridDim.x * tile) {
      load_unrolled<UNROLL, VEC, LD_NC>(x + cv * VEC, C, r0, (i64)rb, M, [&](i64 r, auto& v) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = (v[i] - m[i]) * scale[i] + beta[i];
        store_vec<ST_PLAIN, VEC>(y + r * C + cv * VEC, v);
      });
    }
  }
}
