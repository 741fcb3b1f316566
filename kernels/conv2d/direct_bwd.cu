// conv2d backward on CUDA cores, any groups (depthwise included), both layouts.
//
// dgrad_direct: one thread per dx element (in dx's memory order, so neighbouring threads
//   read neighbouring weights / dy entries); it sums dy * w over the group's K/g output
//   channels and the filter taps on its stride phase (h + pt - r*dh divisible by sh), so a
//   strided convolution costs no work for the taps that miss. DEPTHWISE=1 compiles the
//   C/g == 1 case with the channel multiplier as the only channel loop.
// wgrad_direct_partial: grid (ceil(KCRS / 32), splits), block (32, 8): lane x walks weight
//   elements, lane y and the split walk N*P*Q rows; partial[split][e] in float, fixed order.
//   Weight element e is in dw's memory order, or with DEPTHWISE=1 in (r, s, k) order with k
//   fastest, so an NHWC depthwise warp reads 32 consecutive channels.
// wgrad_direct_finish: dw = sum over splits of partial (in split order), in dw's layout.
// Defines: DNNCTL_DTYPE, NHWC (0/1), DEPTHWISE (0/1).
#include <dnnctl/colsum.cuh>
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

#ifndef DEPTHWISE
#define DEPTHWISE 0
#endif

// The tensors' flat indices: x (N, C, H, W), dy (N, K, P, Q), w (K, C/g, R, S) in the layout.
__device__ __forceinline__ long long x_index(const ConvShape& g, int n, int c, int h, int w) {
  return tensor_index<kChannelsLast>(n, c, h, w, g.c, g.h, g.w);
}
__device__ __forceinline__ long long y_index(const ConvShape& g, int n, int k, int p, int q) {
  return tensor_index<kChannelsLast>(n, k, p, q, g.k, g.p, g.q);
}
__device__ __forceinline__ long long w_index(const ConvShape& g, int k, int c, int r, int s) {
  return tensor_index<kChannelsLast>(k, c, r, s, g.cg, g.r, g.s);
}

extern "C" __global__ void __launch_bounds__(256)
dgrad_direct(const elem_t* __restrict__ dy, const elem_t* __restrict__ wt,
             elem_t* __restrict__ dx, int N, int C, int H, int W, int K, int R, int S, int P,
             int Q, int sh, int sw, int pt, int pl, int dh, int dw, int groups) {
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dw,
                       C / groups, K / groups};
  const int kg = g.kg;
  const long long total = (long long)N * C * H * W;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const TensorCoords o = tensor_coords<kChannelsLast>(e, C, H, W);
    const int grp = o.c / g.cg, cl = o.c - grp * g.cg;
    float acc = 0.f;
    for_each_tap(g, o.h, o.w, [&](int r, int s, int p, int q) {
#if DEPTHWISE
      for (int j = 0; j < kg; ++j) {
        const int k = o.c * kg + j;
        acc += to_float(dy[y_index(g, o.n, k, p, q)]) * to_float(wt[w_index(g, k, 0, r, s)]);
      }
#else
      for (int j = 0; j < kg; ++j) {
        const int k = grp * kg + j;
        acc += to_float(dy[y_index(g, o.n, k, p, q)]) * to_float(wt[w_index(g, k, cl, r, s)]);
      }
#endif
    });
    dx[e] = from_float<elem_t>(acc);
  }
}

// weight element e -> (k, c, r, s)
__device__ __forceinline__ void w_coords(const ConvShape& g, long long e, int& k, int& c,
                                         int& r, int& s) {
#if DEPTHWISE
  k = (int)(e % g.k);
  const int rs = (int)(e / g.k);
  r = rs / g.s;
  s = rs - r * g.s;
  c = 0;
#else
  const TensorCoords t = tensor_coords<kChannelsLast>(e, g.cg, g.r, g.s);
  k = t.n;
  c = t.c;
  r = t.h;
  s = t.w;
#endif
}

extern "C" __global__ void __launch_bounds__(256)
wgrad_direct_partial(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                     float* __restrict__ partial, int N, int C, int H, int W, int K, int R,
                     int S, int P, int Q, int sh, int sw, int pt, int pl, int dh, int dw,
                     int groups, long long rows_per_split) {
  __shared__ float red[8][33];
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dw,
                       C / groups, K / groups};
  const int cg = g.cg, kg = g.kg;
  const long long welems = (long long)K * cg * R * S;
  const long long e = (long long)blockIdx.x * 32 + threadIdx.x;
  const long long M = (long long)N * P * Q;
  const long long m0 = (long long)blockIdx.y * rows_per_split;
  const long long m1 = M < m0 + rows_per_split ? M : m0 + rows_per_split;
  float acc = 0.f;
  if (e < welems) {
    int k, c, r, s;
    w_coords(g, e, k, c, r, s);
    const int cin = (k / kg) * cg + c;
    for (long long m = m0 + threadIdx.y; m < m1; m += 8) {
      const int n = (int)(m / (P * Q));
      const int pq = (int)(m - (long long)n * P * Q);
      const int p = pq / Q, q = pq - p * Q;
      const int h = p * sh - pt + r * dh, w = q * sw - pl + s * dw;
      if ((unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
        acc += to_float(x[x_index(g, n, cin, h, w)]) * to_float(dy[y_index(g, n, k, p, q)]);
    }
  }
  const float sum = block_colsum_32x8(red, acc);
  if (threadIdx.y == 0 && e < welems) partial[(long long)blockIdx.y * welems + e] = sum;
}

extern "C" __global__ void __launch_bounds__(256)
wgrad_direct_finish(const float* __restrict__ partial, elem_t* __restrict__ dwt, int N, int C,
                    int H, int W, int K, int R, int S, int P, int Q, int sh, int sw, int pt,
                    int pl, int dh, int dw, int groups, int splits) {
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dw,
                       C / groups, K / groups};
  const long long welems = (long long)K * g.cg * R * S;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < welems; e += step) {
    float sum = 0.f;
    for (int i = 0; i < splits; ++i) sum += partial[(long long)i * welems + e];
    int k, c, r, s;
    w_coords(g, e, k, c, r, s);
    dwt[w_index(g, k, c, r, s)] = from_float<elem_t>(sum);
  }
}
