// batch_norm training backward, what every backward kernel shares (kernels/norm/
// bn_backward.cu, bn_bwd_persist.cu): the fused ReLU's mask recomputed from x, and what a
// channel's complete sums give (dweight, dbias and the dx coefficients a, b, c0).
#pragma once
#include <dnnctl/bn_epilogue.cuh>
#include <dnnctl/memory.cuh>

#ifndef AFFINE
#define AFFINE 1
#endif
#ifndef LAYOUT
#define LAYOUT 0
#endif

// BN_ACT (the forward was relu(batch_norm(x)), activation: relu): dy counts only where the
// forward's pre-activation (x - mean) * scale + beta was positive, scale = invstd * w and
// beta = bias as the forward computed them (the same fp32 arithmetic, so the same sign); the
// mask is recomputed from x, which both passes read anyway.
__device__ __forceinline__ float bn_relu_scale(const float* invstd, const float* w, int c) {
  return AFFINE ? invstd[c] * w[c] : invstd[c];
}

__device__ __forceinline__ float bn_relu_beta(const float* bias, int c) {
  return AFFINE ? bias[c] : 0.f;
}

__device__ __forceinline__ float bn_relu_gate(float g, float v, float m, float scale,
                                              float beta, float z = 0.f) {
  return BN_ACT && !((v - m) * scale + beta + z > 0.f) ? 0.f : g;
}

__device__ __forceinline__ void bn_bwd_finish(int c, int C, float s1, float s2, float count,
                                              const float* invstd,
                                              const float* w, float* dw, float* db,
                                              float* coef, const float* bias) {
  const float is = invstd[c];
  if (AFFINE) {
    dw[c] = s2 * is;
    db[c] = s1;
  }
  const float a = AFFINE ? w[c] * is : is;
  const float b = -a * is * is * s2 / count;
  coef[c] = a;  // planar: a[C], b[C], c0[C] (the dx pass reads each channel-contiguously)
  coef[C + c] = b;
  coef[2 * C + c] = -a * s1 / count;
  if (BN_ACT) {  // and the mask's scale[C], beta[C]
    coef[3 * C + c] = bn_relu_scale(invstd, w, c);
    coef[4 * C + c] = bn_relu_beta(bias, c);
  }
}
