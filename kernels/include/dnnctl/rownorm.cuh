// Shared pieces of the row normalization kernels (layer_norm, rms_norm: kernels/norm/*.cu).
// Defines: DNNCTL_DTYPE, RMS (0: layer_norm, 1: rms_norm), HAS_W, HAS_B (0/1). Weight and bias
// are (cols,) in the I/O dtype. layer_norm: y = (x - mean) * rsqrt(var + eps) * w + b with the
// biased variance; rms_norm: y = x * rsqrt(mean(x^2) + eps) * w.
#pragma once
#include <dnnctl/memory.cuh>

#ifndef RMS
#define RMS 0
#endif
#ifndef HAS_W
#define HAS_W 1
#endif
#ifndef HAS_B
#define HAS_B 0
#endif

namespace dnnctl {

// Normalize VEC elements of columns c .. c + VEC - 1 in place.
template <int VEC>
__device__ __forceinline__ void norm_apply(float (&f)[VEC], float mean, float rstd,
                                           const elem_t* __restrict__ w,
                                           const elem_t* __restrict__ b, int c) {
  float wv[VEC], bv[VEC];
  if (HAS_W) load_vec<LD_NC, VEC>(w + c, wv);
  if (HAS_B) load_vec<LD_NC, VEC>(b + c, bv);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    float t = (f[i] - mean) * rstd;
    if (HAS_W) t *= wv[i];
    if (HAS_B) t += bv[i];
    f[i] = t;
  }
}

}  // namespace dnnctl
