// pool2d with indices, and pool2d backward (geometry compile-time as in <dnnctl/pool.cuh>).
// pool_argmax: max pooling, a thread per output, writing y and the argmax as the flat index
//   ih * W + iw within the (n, c) plane (PyTorch's convention: the first maximum of the
//   window in tap order; a NaN wins and the last NaN is kept).
// pool_bwd_gather: a thread per input element sums the gradients of every output whose window
//   holds it (max: where the saved index names this element; avg: dy / divisor), so dx is
//   written once per element with no atomics, deterministically, for overlapping windows too.
#include <dnnctl/pool.cuh>

using namespace dnnctl;

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_argmax(const elem_t* __restrict__ x, elem_t* __restrict__ y, int* __restrict__ ind,
            I total) {
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (idx >= total) return;
#if LAYOUT == 0
  const int ow = (int)(idx % OW);
  const I t = idx / OW;
  const int oh = (int)(t % OH);
  const elem_t* xp = x + (t / OH) * ((I)H * W);
  constexpr int PIX = 1;
#else
  const int c = (int)(idx % C);
  I t = idx / C;
  const int ow = (int)(t % OW);
  t /= OW;
  const int oh = (int)(t % OH);
  const elem_t* xp = x + (t / OH) * ((I)H * W * C) + c;
  constexpr int PIX = C;
#endif
  float a = -DNNCTL_INF;
  int best = -1;
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ih = oh * SH - PH + i * DH;
    if (ih < 0 || ih >= H) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int iw = ow * SW - PW + j * DW;
      if (iw < 0 || iw >= W) continue;
      const float v = to_float(xp[(I)(ih * W + iw) * PIX]);
      if (best < 0 || v > a || v != v) {  // v > NaN is false: a NaN stays
        a = v;
        best = ih * W + iw;
      }
    }
  }
  y[idx] = from_float<elem_t>(a);
  ind[idx] = best;
}

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_bwd_gather(const elem_t* __restrict__ dy, const int* __restrict__ ind,
                elem_t* __restrict__ dx, I total) {
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (idx >= total) return;
#if LAYOUT == 0
  const int iw = (int)(idx % W);
  const I t = idx / W;
  const int ih = (int)(t % H);
  const I plane = t / H;
  const elem_t* g = dy + plane * ((I)OH * OW);
  const int* ip = ind + plane * ((I)OH * OW);
  constexpr int PIX = 1;
#else
  const int c = (int)(idx % C);
  I t = idx / C;
  const int iw = (int)(t % W);
  t /= W;
  const int ih = (int)(t % H);
  const I n = t / H;
  const elem_t* g = dy + n * ((I)OH * OW * C) + c;
  const int* ip = ind + n * ((I)OH * OW * C) + c;
  constexpr int PIX = C;
#endif
  const int me = ih * W + iw;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ohs = ih + PH - i * DH;
    if (ohs < 0 || ohs % SH) continue;
    const int oh = ohs / SH;
    if (oh >= OH) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int ows = iw + PW - j * DW;
      if (ows < 0 || ows % SW) continue;
      const int ow = ows / SW;
      if (ow >= OW) continue;
      const I o = (I)(oh * OW + ow) * PIX;
      if (MODE == 0) {
        if (ip[o] == me) acc += to_float(g[o]);
      } else {
        acc += to_float(g[o]) * pool_inv_div(oh, ow);
      }
    }
  }
  dx[idx] = from_float<elem_t>(acc);
}
