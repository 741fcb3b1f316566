// pool2d NHWC, channel-vectorized: a thread computes VEC channels of one output pixel with
// VEC-element (up to 16-byte) loads and stores. Host: C % VEC == 0 and VEC-aligned pointers.
#include <dnnctl/pool_window.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_nhwc(const elem_t* __restrict__ x, elem_t* __restrict__ y, I total) {
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;  // (n, oh, ow, cv)
  if (idx >= total) return;
  int oh, ow, cv;
  const elem_t* xp = x + unflatten<OH, OW, C / VEC>(idx, oh, ow, cv) * ((I)H * W * C) + cv * VEC;
  float a[VEC];
  pool_init<VEC>(a);
  pool_taps(oh, ow, [&](int ih, int iw) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xp + (I)(ih * W + iw) * C, f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) pool_add(a[k], f[k]);
  });
  pool_finish<VEC>(a, oh, ow);
  store_vec<ST_PLAIN, VEC>(y + idx * VEC, a);
}
