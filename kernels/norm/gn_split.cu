// group_norm for few groups: every group is split into gridDim.x slices on separate blocks
// (grid: slices x N*G). gn_split_stats writes each slice's Welford (n, mean, M2) to `part`
// (N*G x slices x 3 floats); gn_split_apply folds a group's partials in a fixed order (so every
// slice gets identical statistics) and normalizes its slice, read moments ago (mostly L2).
#include <dnnctl/groupnorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gn_split_stats(const elem_t* __restrict__ x, float* __restrict__ part, int C, int hw, int G) {
  __shared__ float red[96];
  const GnGroup q = gn_group(blockIdx.y, C, hw, G);
  const int nv = gn_vectors<VEC>(q);
  const int per = (nv + gridDim.x - 1) / gridDim.x;
  const int begin = blockIdx.x * per, end = min(nv, begin + per);
  Welford a = welford_init();
  for (int k = begin + (int)threadIdx.x; k < end; k += BLOCK) {
    int c;
    float f[VEC];
    load_vec<LD_NC, VEC>(x + gn_offset<VEC>(q, k, c), f);
    welford_add_vec(a, f);
  }
  a = block_welford<BLOCK / 32>(a, red);
  if (threadIdx.x == 0) {
    float* o = part + ((i64)blockIdx.y * gridDim.x + blockIdx.x) * 3;
    o[0] = a.n;
    o[1] = a.mean;
    o[2] = a.m2;
  }
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gn_split_apply(const elem_t* __restrict__ x, const float* __restrict__ part,
               elem_t* __restrict__ y, const float* __restrict__ w,
               const float* __restrict__ b, int C, int hw, int G, float eps) {
  const GnGroup q = gn_group(blockIdx.y, C, hw, G);
  Welford a = welford_init();
  for (int s = 0; s < (int)gridDim.x; ++s) {
    const float* p = part + ((i64)blockIdx.y * gridDim.x + s) * 3;
    a = welford_combine(a, Welford{p[0], p[1], p[2]});
  }
  const float mean = a.mean;
  const float rstd = rsqrtf(a.m2 / a.n + eps);
  const int nv = gn_vectors<VEC>(q);
  const int per = (nv + gridDim.x - 1) / gridDim.x;
  const int begin = blockIdx.x * per, end = min(nv, begin + per);
  for (int k = begin + (int)threadIdx.x; k < end; k += BLOCK) {
    int c;
    const i64 off = gn_offset<VEC>(q, k, c);
    float f[VEC];
    load_vec<LD_NC, VEC>(x + off, f);
    gn_apply<VEC>(f, mean, rstd, w, b, c);
    store_vec<ST_PLAIN, VEC>(y + off, f);
  }
}
