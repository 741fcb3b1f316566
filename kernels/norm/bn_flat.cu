// batch_norm inference, flat: resident blocks (grid stride) walk the tensor as one vector
// stream; each block first folds every channel's (mean, scale, beta) into shared memory
// (3 * C floats, dynamic). NCHW channel = (e / hw) % C (host: hw % VEC == 0), NHWC channel =
// e % C (host: C % VEC == 0); else VEC = 1. Defines: DNNCTL_DTYPE, AFFINE, LAYOUT (0 NCHW,
// 1 NHWC).
#include <dnnctl/batchnorm.cuh>

#ifndef LAYOUT
#define LAYOUT 0
#endif

using namespace dnnctl;

template <int BLOCK, int VEC, int UNROLL, typename I>
__global__ void __launch_bounds__(BLOCK)
bn_flat(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* mean,
        const float* var, const float* w, const float* b, I n, I hw, I C, float eps) {
  DNNCTL_DYN_SMEM(float, sp);  // mean[C], scale[C], beta[C]
  for (int c = threadIdx.x; c < (int)C; c += BLOCK)
    bn_params(mean, var, w, b, eps, c, sp[c], sp[C + c], sp[2 * C + c]);
  sync_block();
  const I nvec = n / VEC;
  const I tile = (I)(BLOCK * UNROLL);
  for (I k0 = (I)blockIdx.x * tile + threadIdx.x; k0 < nvec; k0 += (I)gridDim.x * tile) {
    load_unrolled<UNROLL, VEC, LD_NC>(x, (I)VEC, k0, (I)BLOCK, nvec, [&](I k, auto& v) {
      const I e = k * VEC;
#if LAYOUT == 0
      const int c = (int)((e / hw) % C);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = (v[i] - sp[c]) * sp[C + c] + sp[2 * C + c];
#else
      const int c = (int)(e % C);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = (v[i] - sp[c + i]) * sp[C + c + i] + sp[2 * C + c + i];
#endif
      store_vec<ST_PLAIN, VEC>(y + e, v);
    });
  }
}
