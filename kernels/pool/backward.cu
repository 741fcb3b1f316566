// pool2d with indices, and pool2d backward (geometry compile-time as in <dnnctl/pool.cuh>).
// pool_argmax: max pooling, a thread per output, writing y and the argmax as the flat index
//   ih * W + iw within the (n, c) plane (PyTorch's convention: the first maximum of the
//   window in tap order; a NaN wins and the last NaN is kept).
// pool_bwd_gather: a thread per input element sums the gradients of every output whose window
//   holds it (max: where the saved index names this element; avg: dy / divisor), so dx is
//   written once per element with no atomics, deterministically, for overlapping windows too.
#include <dnnctl/pool_window.cuh>

using namespace dnnctl;

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_argmax(const elem_t* __restrict__ x, elem_t* __restrict__ y, int* __restrict__ ind,
            I total) {
  constexpr int PIX = LAYOUT == 0 ? 1 : C;  // elements between two pixels
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (idx >= total) return;
  int oh, ow, c;
  const elem_t* xp = x + unflatten<OH, OW, PIX>(idx, oh, ow, c) * ((I)H * W * PIX) + c;
  float a = -DNNCTL_INF;
  int best = -1;
  pool_taps(oh, ow, [&](int ih, int iw) {
    const float v = to_float(xp[(I)(ih * W + iw) * PIX]);
    if (best < 0 || v > a || v != v) {  // v > NaN is false: a NaN stays
      a = v;
      best = ih * W + iw;
    }
  });
  y[idx] = from_float<elem_t>(a);
  ind[idx] = best;
}

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_bwd_gather(const elem_t* __restrict__ dy, const int* __restrict__ ind,
                elem_t* __restrict__ dx, I total) {
  constexpr int PIX = LAYOUT == 0 ? 1 : C;  // elements between two pixels
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (idx >= total) return;
  int ih, iw, c;
  const I first = unflatten<H, W, PIX>(idx, ih, iw, c) * ((I)OH * OW * PIX) + c;  // (oh, ow) = 0
  const elem_t* g = dy + first;
  const int* ip = ind + first;
  const int me = ih * W + iw;
  float acc = 0.f;
  pool_windows_over(ih, iw, [&](int oh, int ow) {
    const I o = (I)(oh * OW + ow) * PIX;
    if (MODE == 0) {
      if (ip[o] == me) acc += to_float(g[o]);
    } else {
      acc += to_float(g[o]) * pool_inv_div(oh, ow);
    }
  });
  dx[idx] = from_float<elem_t>(acc);
}
