// group_norm, a block per (n, group): single-pass Welford statistics, then a second pass that
// normalizes. STAGE=1 keeps the group in shared memory (cpg*hw*sizeof(elem_t) dynamic bytes;
// each thread re-reads only what it staged), STAGE=0 re-reads global memory (mostly L2).
// See <dnnctl/groupnorm.cuh> for the layout rules.
#include <dnnctl/groupnorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int STAGE>
__global__ void __launch_bounds__(BLOCK)
gn_block(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* __restrict__ w,
         const float* __restrict__ b, int C, int hw, int G, float eps) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[96];
  const GnGroup q = gn_group(blockIdx.x, C, hw, G);
  const int nv = gn_vectors<VEC>(q);
  Welford a = welford_init();
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    int c;
    float f[VEC];
    load_vec<LD_NC, VEC>(x + gn_offset<VEC>(q, k, c), f);
    if (STAGE) store_vec<ST_PLAIN, VEC>(buf + (i64)k * VEC, f);
    welford_add_vec(a, f);
  }
  a = block_welford<BLOCK / 32>(a, red);
  const float mean = a.mean;
  const float rstd = rsqrtf(a.m2 / a.n + eps);
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    int c;
    const i64 off = gn_offset<VEC>(q, k, c);
    float f[VEC];
    if (STAGE) load_vec<LD_PLAIN, VEC>(buf + (i64)k * VEC, f);
    else load_vec<LD_NC, VEC>(x + off, f);
    gn_apply<VEC>(f, mean, rstd, w, b, c);
    store_vec<ST_PLAIN, VEC>(y + off, f);
  }
}
