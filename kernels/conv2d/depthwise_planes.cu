// conv2d "depthwise_planes": NCHW depthwise convolution (K == C) by whole planes.
//
// In NCHW the PB planes (n, c) .. (n, c + PB - 1) of a block are one contiguous stretch of
// memory in x, and their outputs one contiguous stretch of y (plane index n * C + c; it runs
// on into the next image, which is just as contiguous). A block copies its PB input planes
// into shared memory with VEC-wide loads (fully coalesced, every byte read once), then each
// thread computes outputs along the flat output stretch (consecutive threads, consecutive
// outputs: coalesced stores) from shared memory, taps unrolled and the plane geometry
// compiled in (index math is by constants). Small planes (the 7x7 .. 56x56 of MobileNet-style
// networks) are where the spatial-tile kernel wastes most: its tiles overhang the plane.
//
// Defines: DNNCTL_DTYPE; KR, KS, STR_H, STR_W, DIL_H, DIL_W; H, W (input plane), P, Q
// (output plane), PT, PL (top / left padding; bottom / right follow from P, Q); PB (planes
// per block), THREADS, VEC (elements per load; H * W % VEC == 0 and x VEC-aligned).
// Grid: x = ceil(N * C / PB). Dynamic shared memory: none (PB * H * W * 4 bytes static).
#include <dnnctl/conv.cuh>
#include <dnnctl/depthwise_filter.cuh>

using namespace dnnctl;

#ifndef H
#define H 14
#endif
#ifndef W
#define W 14
#endif
#ifndef P
#define P 14
#endif
#ifndef Q
#define Q 14
#endif
#ifndef PT
#define PT 1
#endif
#ifndef PL
#define PL 1
#endif
#ifndef PB
#define PB 8
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef VEC
#define VEC 1
#endif

#define HW (H * W)
#define PQ (P * Q)

static_assert(HW % VEC == 0, "VEC must divide the plane size");
static_assert(PB * (HW + KR * KS) * 4 <= 48 * 1024, "planes exceed static shared memory");

#define SV (VEC >= 4 ? 4 : VEC)  // floats per shared-memory store
template <int N>
struct alignas(4 * N) FloatVec {
  float v[N];
};

extern "C" __global__ void __launch_bounds__(THREADS)
dw_planes(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y,
          const elem_t* __restrict__ bias, const elem_t* __restrict__ residual, int planes,
          int C, int act, int flags) {
  __align__(16) __shared__ float xs[PB * HW];
  __shared__ float ws[PB][KR * KS];
  const int tid = (int)threadIdx.x;
  const long long p0 = (long long)blockIdx.x * PB;
  const int np = planes - p0 < PB ? (int)(planes - p0) : PB;  // planes of this block

  // stage the block's planes: one contiguous stretch of np * HW elements
  const elem_t* src = x + p0 * HW;
  const int nvec = np * (HW / VEC);
  for (int i = tid; i < nvec; i += THREADS) {
    float v[VEC];
    conv::load_vec<VEC>(v, src + (long long)i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; e += SV) {
      FloatVec<SV> t;
#pragma unroll
      for (int u = 0; u < SV; ++u) t.v[u] = v[e + u];
      *reinterpret_cast<FloatVec<SV>*>(xs + i * VEC + e) = t;
    }
  }
  const int c0 = (int)(p0 % C);  // channel of the block's first plane
  for (int i = tid; i < np * KR * KS; i += THREADS) {
    const int j = i / (KR * KS), t = i - j * (KR * KS);
    const int c = (c0 + j) % C;
    ws[j][t] = to_float(w[(long long)c * (KR * KS) + t]);
  }
  DNNCTL_SYNC();

  const long long ybase = p0 * PQ;
  for (int o = tid; o < np * PQ; o += THREADS) {
    const int j = o / PQ;
    const int rem = o - j * PQ;
    const int p = rem / Q, q = rem - (rem / Q) * Q;
    const float* plane = xs + j * HW;
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < KR; ++r) {
      const int ih = p * STR_H - PT + r * DIL_H;
      if ((unsigned)ih >= (unsigned)H) continue;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int iw = q * STR_W - PL + s * DIL_W;
        if ((unsigned)iw < (unsigned)W) acc = fmaf(plane[ih * W + iw], ws[j][r * KS + s], acc);
      }
    }
    const int c = (c0 + j) % C;
    const long long yi = ybase + o;
    y[yi] = from_float<elem_t>(conv::epilogue(acc, c, yi, bias, residual, act, flags));
  }
}
