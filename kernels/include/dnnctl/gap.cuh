// Shared pieces of the global_avg_pool2d kernels (kernels/pool/gap_*.cu). NHWC kernels split a
// block into channel-vector lanes by pixel row lanes (<dnnctl/chanreduce.cuh>).
#pragma once
#include <dnnctl/chanreduce.cuh>

namespace dnnctl {

// NHWC: the per-lane channel sums `a` folded over the row lanes through `sacc` (BLOCK * VEC
// floats of shared memory); the first row lane stores the means of its VEC channels at
// yn + cv * VEC (yn: the sample's C outputs). Whole block.
template <int BLOCK, int VEC>
__device__ __forceinline__ void gap_rows_store(float* sacc, const ChannelTile& t,
                                               const float (&a)[VEC], elem_t* yn, int hw) {
  fold_row_lanes<BLOCK, VEC>(sacc, t, a, 0.f, add_float, [&](float (&total)[VEC]) {
    const float inv = 1.f / (float)hw;
#pragma unroll
    for (int i = 0; i < VEC; ++i) total[i] *= inv;
    store_vec<ST_PLAIN, VEC>(yn + t.cv * VEC, total);
  });
}

// The sum of one vector's VEC values added to s.
template <int VEC>
__device__ __forceinline__ void vec_sum_into(float& s, const float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) s += f[i];
}

// Per-channel sums: one vector of VEC channels added to a[i].
template <int VEC>
__device__ __forceinline__ void vec_add_into(float (&a)[VEC], const float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] += f[i];
}

// NCHW: TPP threads (part of a warp) reduce one plane of hw contiguous values each, U vector
// loads in flight per thread (U = 1: one per loop trip), then shuffles.
template <int BLOCK, int TPP, int VEC, int U>
__device__ __forceinline__ void gap_planes_mean(const elem_t* __restrict__ x,
                                                elem_t* __restrict__ y, i64 planes, int hw) {
  const i64 p = (i64)blockIdx.x * (BLOCK / TPP) + threadIdx.x / TPP;
  const int lane = threadIdx.x % TPP;
  float s = 0.f;
  if (p < planes) {
    const elem_t* xp = x + p * hw;
    const int nv = hw / VEC;
    for (int k0 = lane; k0 < nv; k0 += TPP * U)
      load_unrolled<U, VEC, LD_NC>(xp, VEC, k0, TPP, nv, [&](int, auto& f) { vec_sum_into(s, f); });
  }
  s = group_sum<TPP>(s);
  if (p < planes && lane == 0) y[p] = from_float<elem_t>(s / (float)hw);
}

// NHWC: a block per (n = blockIdx.x, tile blockIdx.y of `lanes` channel vectors); its BLOCK /
// lanes row lanes stride over the pixels (U loads in flight per thread), then fold through
// shared memory (BLOCK * VEC floats, dynamic).
template <int BLOCK, int VEC, int U>
__device__ __forceinline__ void gap_rows_mean(const elem_t* __restrict__ x,
                                              elem_t* __restrict__ y, int hw, int C, int lanes) {
  DNNCTL_DYN_SMEM(float, sacc);  // [BLOCK][VEC]
  const ChannelTile t = channel_lanes<BLOCK>(C / VEC, lanes, blockIdx.y);
  const i64 n = blockIdx.x;
  float a[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] = 0.f;
  if (t.live) {
    const elem_t* xp = x + n * hw * C + t.cv * VEC;
    for (int p0 = t.ty; p0 < hw; p0 += t.rb * U)
      load_unrolled<U, VEC, LD_NC>(xp, (i64)C, p0, t.rb, hw,
                                   [&](int, auto& f) { vec_add_into(a, f); });
  }
  gap_rows_store<BLOCK, VEC>(sacc, t, a, y + n * C, hw);
}

}  // namespace dnnctl
