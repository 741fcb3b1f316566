// pool2d NHWC, channel-vectorized: a thread computes VEC channels of one output pixel with
// VEC-element (up to 16-byte) loads and stores. Host: C % VEC == 0 and VEC-aligned pointers.
#include <dnnctl/pool.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_nhwc(const elem_t* __restrict__ x, elem_t* __restrict__ y, I total) {
  constexpr int CV = C / VEC;
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;  // (n, oh, ow, cv)
  if (idx >= total) return;
  const int cv = (int)(idx % CV);
  I t = idx / CV;
  const int ow = (int)(t % OW);
  t /= OW;
  const int oh = (int)(t % OH);
  const elem_t* xp = x + (t / OH) * ((I)H * W * C) + cv * VEC;
  float a[VEC];
  pool_init<VEC>(a);
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ih = oh * SH - PH + i * DH;
    if (ih < 0 || ih >= H) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int iw = ow * SW - PW + j * DW;
      if (iw < 0 || iw >= W) continue;
      float f[VEC];
      load_vec<LD_NC, VEC>(xp + (I)(ih * W + iw) * C, f);
#pragma unroll
      for (int k = 0; k < VEC; ++k) pool_add(a[k], f[k]);
    }
  }
  if (MODE == 1) {
    const float inv = pool_inv_div(oh, ow);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] *= inv;
  }
  store_vec<ST_PLAIN, VEC>(y + idx * VEC, a);
}
