// pool2d, a thread per output element, NCHW or NHWC (consecutive threads: consecutive ow
// (NCHW) or channels (NHWC), so loads coalesce). Scalar loads; the kernel-tap loops unroll.
#include <dnnctl/pool.cuh>

using namespace dnnctl;

template <int BLOCK, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_thread(const elem_t* __restrict__ x, elem_t* __restrict__ y, I total) {
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
  float a[1];
  pool_init<1>(a);
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ih = oh * SH - PH + i * DH;
    if (ih < 0 || ih >= H) continue;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int iw = ow * SW - PW + j * DW;
      if (iw < 0 || iw >= W) continue;
      pool_add(a[0], to_float(xp[(I)(ih * W + iw) * PIX]));
    }
  }
  y[idx] = from_float<elem_t>(MODE == 0 ? a[0] : a[0] * pool_inv_div(oh, ow));
}
