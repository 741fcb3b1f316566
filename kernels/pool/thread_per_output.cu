// pool2d, a thread per output element, NCHW or NHWC (consecutive threads: consecutive ow
// (NCHW) or channels (NHWC), so loads coalesce). Scalar loads; the kernel-tap loops unroll.
#include <dnnctl/pool_window.cuh>

using namespace dnnctl;

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_thread(const elem_t* __restrict__ x, elem_t* __restrict__ y, I total) {
  constexpr int PIX = LAYOUT == 0 ? 1 : C;  // elements between two pixels
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (idx >= total) return;
  int oh, ow, c;
  const elem_t* xp = x + unflatten<OH, OW, PIX>(idx, oh, ow, c) * ((I)H * W * PIX) + c;
  float a[1];
  pool_init<1>(a);
  pool_taps(oh, ow,
            [&](int ih, int iw) { pool_add(a[0], to_float(xp[(I)(ih * W + iw) * PIX])); });
  pool_finish<1>(a, oh, ow);
  y[idx] = from_float<elem_t>(a[0]);
}
