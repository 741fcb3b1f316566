// global_avg_pool2d, one pass, U loads in flight per thread: gap_reduce's kernels issue one
// load per loop trip (the add waits for it before the next load), so a block has BLOCK
// vectors in flight; here each trip issues U independent loads first, then adds them.
// NCHW (gap_planes_u): TPP threads (part of a warp) per plane of hw contiguous values.
// NHWC (gap_rows_u): a block per (n, tile of `lanes` channel vectors); its BLOCK / lanes rows
// of threads stride over the pixels, then fold through shared memory (BLOCK * VEC floats).
// Host: NCHW hw % VEC == 0, NHWC C % VEC == 0, VEC-aligned pointers (else VEC = 1).
#include <dnnctl/memory.cuh>

using namespace dnnctl;

template <int BLOCK, int TPP, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
gap_planes_u(const elem_t* __restrict__ x, elem_t* __restrict__ y, i64 planes, int hw) {
  const i64 p = (i64)blockIdx.x * (BLOCK / TPP) + threadIdx.x / TPP;
  const int lane = threadIdx.x % TPP;
  float s = 0.f;
  if (p < planes) {
    const elem_t* xp = x + p * hw;
    const int nv = hw / VEC;
    for (int k0 = lane; k0 < nv; k0 += TPP * U) {
      float f[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * TPP;
        if (k < nv) load_vec<LD_NC, VEC>(xp + k * VEC, f[u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (k0 + u * TPP < nv) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) s += f[u][i];
        }
      }
    }
  }
  s = group_sum<TPP>(s);
  if (p < planes && lane == 0) y[p] = from_float<elem_t>(s / (float)hw);
}

template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
gap_rows_u(const elem_t* __restrict__ x, elem_t* __restrict__ y, int hw, int C, int lanes) {
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
    for (int p0 = ty; p0 < hw; p0 += rb * U) {
      float f[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = p0 + u * rb;
        if (p < hw) load_vec<LD_NC, VEC>(xp + (i64)p * C, f[u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (p0 + u * rb < hw) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) a[i] += f[u][i];
        }
      }
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
