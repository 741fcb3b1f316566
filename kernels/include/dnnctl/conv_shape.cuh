// dnnctl convolution geometry shared by the conv2d kernels: the problem's shape, the input
// window of an output pixel, flat indices of NCHW / NHWC tensors, the filter taps that read an
// input pixel (dgrad's gather form), and the carried (c, r, s) position of the implicit-GEMM
// gathers. Include as <dnnctl/conv_shape.cuh>.
#pragma once
#include <dnnctl/common.cuh>

namespace dnnctl {

// Input N x C x H x W, filter K x C/groups x R x S, output N x K x P x Q; stride (sh, sw),
// top / left padding (pt, pl), dilation (dh, dw); cg = C / groups and kg = K / groups
// channels per group. Kernels fill it from their arguments in this order.
struct ConvShape {
  int n, c, h, w, k, r, s, p, q, sh, sw, pt, pl, dh, dw, cg, kg;
};

// Output pixel m of the N*P*Q in (image, p, q) order: its image and the input row / column
// of its window's first tap (r = s = 0), padding subtracted (so possibly outside the image).
struct PixelWindow {
  int n, h0, w0;
};

__device__ __forceinline__ PixelWindow pixel_window(const ConvShape& g, int m) {
  const int pq = g.p * g.q;
  const int nn = m / pq, rem = m - nn * pq;
  const int pp = rem / g.q, qq = rem - pp * g.q;
  return {nn, pp * g.sh - g.pt, qq * g.sw - g.pl};
}

// Digits of a flat index over four dimensions, d0 the fastest:
// e = ((i3 * d2 + i2) * d1 + i1) * d0 + i0.
__device__ __forceinline__ void unravel4(long long e, int d0, int d1, int d2, int& i0, int& i1,
                                         int& i2, int& i3) {
  i0 = (int)(e % d0);
  e /= d0;
  i1 = (int)(e % d1);
  e /= d1;
  i2 = (int)(e % d2);
  i3 = (int)(e / d2);
}

// Coordinates of the flat index e of an (N, C, H, W) tensor stored NHWC (CHANNELS_LAST:
// channels fastest) or NCHW (rows of W fastest): the memory order of element-wise kernels' threads.
struct TensorCoords {
  int n, c, h, w;
};

template <bool CHANNELS_LAST>
__device__ __forceinline__ TensorCoords tensor_coords(long long e, int C, int H, int W) {
  TensorCoords t;
  if (CHANNELS_LAST)
    unravel4(e, C, W, H, t.c, t.w, t.h, t.n);
  else
    unravel4(e, W, H, C, t.w, t.h, t.c, t.n);
  return t;
}

// Flat index of (n, c, h, w) in an (N, C, H, W) tensor stored NHWC or NCHW.
template <bool CHANNELS_LAST>
__device__ __forceinline__ long long tensor_index(int n, int c, int h, int w, int C, int H,
                                                  int W) {
  return CHANNELS_LAST ? (((long long)n * H + h) * W + w) * C + c
                       : (((long long)n * C + c) * H + h) * W + w;
}

// The output row (or column) that input row i meets through filter tap r: the p in [0, P)
// with p * stride = i + pad - r * dil, or -1 where there is none (a dgrad tap contributes
// only on its stride phase).
__device__ __forceinline__ int tap_output(int i, int pad, int r, int dil, int stride, int P) {
  const int t = i + pad - r * dil;
  if (t < 0 || t % stride) return -1;
  const int p = t / stride;
  return p < P ? p : -1;
}

// Calls f(r, s, p, q) for every filter tap (r, s) that reads input pixel (h, w), with the
// output pixel (p, q) it reads it for: the gather form of dgrad (no atomics), stride phases
// only, taps in (r, s) order.
template <class F>
__device__ __forceinline__ void for_each_tap(const ConvShape& g, int h, int w, F&& f) {
  for (int r = 0; r < g.r; ++r) {
    const int p = tap_output(h, g.pt, r, g.dh, g.sh, g.p);
    if (p < 0) continue;
    for (int s = 0; s < g.s; ++s) {
      const int q = tap_output(w, g.pl, s, g.dw, g.sw, g.q);
      if (q < 0) continue;
      f(r, s, p, q);
    }
  }
}

// Steps a reduction position of three digits (lo fastest, lo < lo_n, mid < mid_n, hi
// unbounded) forward by step, carrying into mid and hi: the implicit GEMMs' gathers walk
// (c, s, r) in NHWC order or (s, r, c) in NCHW order this way instead of dividing.
__device__ __forceinline__ void carry_add(int& lo, int& mid, int& hi, int step, int lo_n,
                                          int mid_n) {
  lo += step;
  while (lo >= lo_n) {
    lo -= lo_n;
    if (++mid == mid_n) {
      mid = 0;
      ++hi;
    }
  }
}

}  // namespace dnnctl
