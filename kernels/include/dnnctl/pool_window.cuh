// How the pool2d kernels (kernels/pool/*.cu) find a thread's element and walk a window, on top
// of <dnnctl/pool.cuh> (the compile-time geometry, the max / avg arithmetic).
#pragma once
#include <dnnctl/pool.cuh>

namespace dnnctl {

// A flat index idx = ((outer * HH + h) * WW + w) * CI + ci decoded innermost first; returns
// outer. NCHW kernels use CI = 1 (outer: the (n, c) plane), NHWC ones the channels (or channel
// vectors) of a pixel (outer: the sample).
template <int HH, int WW, int CI, typename I>
__device__ __forceinline__ I unflatten(I idx, int& h, int& w, int& ci) {
  ci = (int)(idx % CI);
  I t = idx / CI;
  w = (int)(t % WW);
  t /= WW;
  h = (int)(t % HH);
  return t / HH;
}

// fn(ih, iw) for every tap of the window of output (oh, ow) that lies inside the input, in
// tap order (kernel rows, then columns; unrolled).
template <typename F>
__device__ __forceinline__ void pool_taps(int oh, int ow, F&& fn) {
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ih = oh * SH - PH + i * DH;
    if (ih < 0 || ih >= H) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int iw = ow * SW - PW + j * DW;
      if (iw >= 0 && iw < W) fn(ih, iw);
    }
  }
}

// Along one axis: the output whose tap t (stride S, padding P, dilation DL) lands on input
// coordinate `in`, or -1 when there is none among the NOUT outputs.
template <int S, int P, int DL, int NOUT>
__device__ __forceinline__ int pool_tap_output(int in, int t) {
  const int s = in + P - t * DL;
  if (s < 0 || s % S) return -1;
  const int o = s / S;
  return o < NOUT ? o : -1;
}

// fn(oh, ow) for every output whose window holds input pixel (ih, iw), in tap order (the
// gather of the backward pass; unrolled).
template <typename F>
__device__ __forceinline__ void pool_windows_over(int ih, int iw, F&& fn) {
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int oh = pool_tap_output<SH, PH, DH, OH>(ih, i);
    if (oh < 0) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int ow = pool_tap_output<SW, PW, DW, OW>(iw, j);
      if (ow >= 0) fn(oh, ow);
    }
  }
}

// The VEC window results of output (oh, ow): avg divides the sums by the divisor, max keeps
// them as they are.
template <int VEC>
__device__ __forceinline__ void pool_finish(float (&a)[VEC], int oh, int ow) {
  if (MODE == 1) {
    const float inv = pool_inv_div(oh, ow);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] *= inv;
  }
}

}  // namespace dnnctl
