// Shared pieces of the pool2d kernels (kernels/pool/*.cu). The whole geometry is compile-time
// (one module per problem; index divisions become multiplications):
//   H, W, C, OH, OW, KR, KS, SH, SW, PH, PW, DH, DW, MODE (0 max, 1 avg), CIP (avg:
//   count_include_pad), LAYOUT (0 NCHW, 1 NHWC), DNNCTL_DTYPE.
// max: padding never wins, NaN propagates (as PyTorch); avg: PyTorch's divisor rule (windows
// clipped to the padded input; count_include_pad counts padding, else only real taps).
#pragma once
#include <dnnctl/memory.cuh>

namespace dnnctl {

template <int VEC>
__device__ __forceinline__ void pool_init(float (&a)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] = MODE == 0 ? -DNNCTL_INF : 0.f;
}

__device__ __forceinline__ void pool_add(float& a, float v) {
  if (MODE == 0) {
    if (v > a || v != v) a = v;  // once a is NaN it stays NaN
  } else {
    a += v;
  }
}

// 1 / divisor of output (oh, ow) for avg pooling (dilation is 1 for avg).
__device__ __forceinline__ float pool_inv_div(int oh, int ow) {
  int hs = oh * SH - PH, ws = ow * SW - PW;
  int he = min(hs + KR, H + PH), we = min(ws + KS, W + PW);
  const int pool = (he - hs) * (we - ws);
  hs = max(hs, 0);
  ws = max(ws, 0);
  he = min(he, H);
  we = min(we, W);
  return 1.f / (float)(CIP ? pool : (he - hs) * (we - ws));
}

}  // namespace dnnctl
