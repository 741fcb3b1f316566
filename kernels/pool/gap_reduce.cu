// global_avg_pool2d, one pass. NCHW (gap_planes): TPP threads (part of a warp) reduce one
// plane of hw contiguous values with VEC-element loads and shuffles. NHWC (gap_rows): a block
// per (n, tile of `lanes` channel vectors); its BLOCK / lanes rows of threads stride over the
// pixels, then fold through shared memory (BLOCK * VEC floats). Host: NCHW hw % VEC == 0,
// NHWC C % VEC == 0, VEC-aligned pointers (else VEC = 1).
#include <dnnctl/memory.cuh>

using namespace dnnctl;

template <int BLOCK, int TPP, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_planes(const elem_t* __restrict__ x, elem_t* __restrict__ y, i64 planes, int hw) {
  const i64 p = (i64)blockIdx.x * (BLOCK / TPP) + threadIdx.x / TPP;
  const int lane = threadIdx.x % TPP;
  float s = 0.f;
  if (p < planes) {
    const elem_t* xp = x + p * hw;
    for (int k = lane; k < hw / VEC; k += TPP) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xp + k * VEC, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += f[i];
    }
  }
  s = group_sum<TPP>(s);
  if (p < planes && lane == 0) y[p] = from_float<elem_t>(s / (float)hw);
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, int hw, int C, int lanes) {
  DNNCTL_DYN_SMEM(float, sacc);  // [BLOCK][VEC]
  const int cvn = C / VEC;
  const int rb = BLOCK / lanes;
  const int tx = threadIdx.x % lanes, ty = threadIdx.x / lanes;
  const int cv = blockIdx.y * lanes + tx;
  const i64 n = blockIdx.x;
  float a[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] = 0.f;
  if (ty < rb && cv < cvn) {
    const elem_t* xp = x + n * hw * C + cv * VEC;
    for (int p = ty; p < hw; p += rb) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xp + (i64)p * C, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[i] += f[i];
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) sacc[threadIdx.x * VEC + i] = a[i];
  sync_block();
  if (ty != 0 || cv >= cvn) return;
  for (int r = 1; r < rb; ++r) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] += sacc[(r * lanes + tx) * VEC + i];
  }
  const float inv = 1.f / (float)hw;
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] *= inv;
  store_vec<ST_PLAIN, VEC>(y + n * C + cv * VEC, a);
}
