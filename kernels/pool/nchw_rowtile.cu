// pool2d NCHW, row tiles: a thread computes OWT consecutive outputs of one output row. For
// each kernel row it loads the input span those outputs cover once into registers
// (SPAN = (OWT-1)*SW + (KS-1)*DW + 1 values; padding as the pooling identity), so overlapping
// windows (stride < kernel) reuse loads instead of re-reading.
#include <dnnctl/pool_window.cuh>

using namespace dnnctl;

template <int BLOCK, int OWT, typename I>
__global__ void __launch_bounds__(BLOCK)
pool_rowtile(const elem_t* __restrict__ x, elem_t* __restrict__ y, I total) {
  constexpr int OWB = (OW + OWT - 1) / OWT;
  constexpr int SPAN = (OWT - 1) * SW + (KS - 1) * DW + 1;
  const I idx = (I)blockIdx.x * BLOCK + threadIdx.x;  // (n*c, oh, ow block)
  if (idx >= total) return;
  int oh, owb, none;
  const I plane = unflatten<OH, OWB, 1>(idx, oh, owb, none);
  const int ow0 = owb * OWT;
  const elem_t* xp = x + plane * ((I)H * W);
  const int iw0 = ow0 * SW - PW;
  float a[OWT];
  pool_init<OWT>(a);
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    const int ih = oh * SH - PH + i * DH;
    if (ih < 0 || ih >= H) continue;
    const elem_t* row = xp + ih * W;
    float r[SPAN];
#pragma unroll
    for (int k = 0; k < SPAN; ++k) {
      const int iw = iw0 + k;
      r[k] = (iw >= 0 && iw < W) ? to_float(row[iw]) : (MODE == 0 ? -DNNCTL_INF : 0.f);
    }
#pragma unroll
    for (int o = 0; o < OWT; ++o) {
#pragma unroll
      for (int j = 0; j < KS; ++j) pool_add(a[o], r[o * SW + j * DW]);
    }
  }
  elem_t* yp = y + (plane * OH + oh) * (I)OW + ow0;
#pragma unroll
  for (int o = 0; o < OWT; ++o) {
    if (ow0 + o < OW)
      yp[o] = from_float<elem_t>(MODE == 0 ? a[o] : a[o] * pool_inv_div(oh, ow0 + o));
  }
}
