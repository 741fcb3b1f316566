// batch_norm normalize as an exact-grid vector stream (kernels/norm/bn_exact.cu for
// inference, kernels/norm/bn_stream.cu for the last pass of training): the tensor is one
// stream of VEC-element vectors; thread t of block b handles the UNROLL vectors
// b * BLOCK * UNROLL + t + u * BLOCK (a warp's accesses stay contiguous) and the grid covers
// the tensor once. With REV the blocks walk the tensor from its end: right after a pass that
// read x front to back (training statistics), the most recently read part of x, still in L2,
// comes first.
// A vector's channel comes from its flat index with the geometry compiled in (CH, HW: the
// divisions become multiplications). There is no parameter prologue: each thread reads the
// fp32 parameters of its channels itself (L1-resident after the first warps), and those loads
// do not depend on the x loads, so both are in flight together.
//   NHWC: a vector holds channels c .. c + VEC - 1 (host: CH % VEC == 0; the parameter
//         arrays aligned to min(16, 4 * VEC) bytes); when CH divides BLOCK * VEC every vector
//         of a thread has the same channels and the parameters are read once.
//   NCHW: a vector lies in one plane (host: HW % VEC == 0): one channel per vector.
// Defines: DNNCTL_DTYPE, AFFINE, PARAMS (see <dnnctl/batchnorm.cuh>), LAYOUT (0 NCHW,
// 1 NHWC), CH, HW, BN_ACT (1: a fused ReLU on y), BN_RESID (1: z, x's shape, added to bn(x)
// before the ReLU; the kernel's last argument, null otherwise).
#pragma once
#include <dnnctl/batchnorm.cuh>
#include <dnnctl/bn_epilogue.cuh>

#ifndef LAYOUT
#define LAYOUT 0
#endif

namespace dnnctl {

// NHWC: mean, scale and beta of channels c .. c + VEC - 1 (vector loads of the fp32 arrays);
// y = (x - mean) * scale + beta as in the other kernels.
template <int VEC>
__device__ __forceinline__ void bn_params_vec(const float* mean, const float* var_or_scale,
                                              const float* w, const float* b, float eps, int c,
                                              float (&m)[VEC], float (&scale)[VEC],
                                              float (&beta)[VEC]) {
  float wv[VEC];
  load_f32<VEC>(mean + c, m);
  load_f32<VEC>(var_or_scale + c, scale);
  if (AFFINE) {
    if (PARAMS == 0) load_f32<VEC>(w + c, wv);
    load_f32<VEC>(b + c, beta);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    if (PARAMS == 0) {
      scale[i] = rsqrtf(scale[i] + eps);
      if (AFFINE) scale[i] *= wv[i];
    }
    if (!AFFINE) beta[i] = 0.f;
  }
}

}  // namespace dnnctl

template <int BLOCK, int VEC, int UNROLL, int REV, typename I>
__global__ void __launch_bounds__(BLOCK)
bn_exact(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* __restrict__ mean,
         const float* __restrict__ var_or_scale, const float* __restrict__ w,
         const float* __restrict__ b, I n, float eps, const elem_t* __restrict__ z) {
  const I nvec = n / VEC;
  const I blk = REV ? (I)(gridDim.x - 1 - blockIdx.x) : (I)blockIdx.x;
  const I base = blk * (I)(BLOCK * UNROLL) + threadIdx.x;
  float v[UNROLL][VEC];
  float r[BN_RESID ? UNROLL : 1][VEC];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const I k = base + (I)(u * BLOCK);
    if (k < nvec) {
      load_vec<LD_NC, VEC>(x + k * VEC, v[u]);
      if (BN_RESID) load_vec<LD_NC, VEC>(z + k * VEC, r[BN_RESID ? u : 0]);
    }
  }
#if LAYOUT == 1
  constexpr bool SAME = (BLOCK * VEC) % CH == 0;  // every vector of the thread: same channels
  float m[VEC], scale[VEC], beta[VEC];
  if (SAME && base < nvec)
    bn_params_vec<VEC>(mean, var_or_scale, w, b, eps, (int)((base * VEC) % (I)CH), m, scale,
                       beta);
#endif
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const I k = base + (I)(u * BLOCK);
    if (k < nvec) {
#if LAYOUT == 1
      if (!SAME)
        bn_params_vec<VEC>(mean, var_or_scale, w, b, eps, (int)((k * VEC) % (I)CH), m, scale,
                           beta);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        v[u][i] = (v[u][i] - m[i]) * scale[i] + beta[i];
        if (BN_RESID) v[u][i] += r[BN_RESID ? u : 0][i];
        if (BN_ACT && v[u][i] < 0.f) v[u][i] = 0.f;
      }
#else
      const int c = (int)((k * VEC / (I)HW) % (I)CH);
      float m, scale, beta;
      bn_params(mean, var_or_scale, w, b, eps, c, m, scale, beta);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        v[u][i] = (v[u][i] - m) * scale + beta;
        if (BN_RESID) v[u][i] += r[BN_RESID ? u : 0][i];
        if (BN_ACT && v[u][i] < 0.f) v[u][i] = 0.f;
      }
#endif
      store_vec<ST_PLAIN, VEC>(y + k * VEC, v[u]);
    }
  }
}
