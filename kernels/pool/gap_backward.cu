// global_avg_pool2d backward: dx[n, c, h, w] = dy[n, c] / (H * W), a grid-stride vector
// stream over dx. NCHW: a vector stays in one plane (hw % VEC == 0); NHWC: a vector holds VEC
// channels of one pixel (C % VEC == 0). Defines: DNNCTL_DTYPE, LAYOUT.
#include <dnnctl/memory.cuh>

#ifndef LAYOUT
#define LAYOUT 0
#endif

using namespace dnnctl;

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
gap_bwd(const elem_t* __restrict__ dy, elem_t* __restrict__ dx, I nvec, int C, int hw,
        float inv) {
  for (I k = (I)blockIdx.x * BLOCK + threadIdx.x; k < nvec; k += (I)gridDim.x * BLOCK) {
    const I e = k * VEC;
    float v[VEC];
    if (LAYOUT == 0) {
      const float g = to_float(__ldg(dy + e / hw)) * inv;
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = g;
    } else {
      const I c0 = e % C;
      load_vec<LD_NC, VEC>(dy + (e / ((I)hw * C)) * C + c0, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] *= inv;
    }
    store_vec<ST_PLAIN, VEC>(dx + e, v);
  }
}
