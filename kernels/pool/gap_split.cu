// global_avg_pool2d for few, large planes: pixels are split into gridDim.y chunks reduced by
// separate blocks into fp32 partials, then a finalize kernel (a thread per output) adds a
// fixed-order sum of its partials and scales by 1 / hw.
//   NCHW gap_split_planes: grid (planes, S); partial[plane * S + s].
//   NHWC gap_split_rows:   grid (N * tiles, S); block = `lanes` channel vectors x rows;
//                          partial[(n * S + s) * C + c].
// Host: NCHW hw % VEC == 0, NHWC C % VEC == 0, VEC-aligned x (else VEC = 1).
#include <dnnctl/gap.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_split_planes(const elem_t* __restrict__ x, float* __restrict__ part, int hw, int chunk) {
  __shared__ float red[32];
  const i64 p = blockIdx.x;
  const int nv = hw / VEC;
  const int begin = blockIdx.y * chunk, end = min(nv, begin + chunk);
  const elem_t* xp = x + p * hw;
  float s = 0.f;
  for (int k = begin + (int)threadIdx.x; k < end; k += BLOCK) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xp + (i64)k * VEC, f);
    vec_sum_into(s, f);
  }
  s = block_sum<BLOCK / 32>(s, red);
  if (threadIdx.x == 0) part[p * gridDim.y + blockIdx.y] = s;
}

__global__ void __launch_bounds__(128)
gap_split_planes_fin(const float* __restrict__ part, elem_t* __restrict__ y, i64 planes, int S,
                     int hw) {
  const i64 p = (i64)blockIdx.x * 128 + threadIdx.x;
  if (p >= planes) return;
  float s = 0.f;
  for (int i = 0; i < S; ++i) s += part[p * S + i];
  y[p] = from_float<elem_t>(s / (float)hw);
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_split_rows(const elem_t* __restrict__ x, float* __restrict__ part, int hw, int C,
               int lanes, int pchunk) {
  DNNCTL_DYN_SMEM(float, sacc);  // [BLOCK][VEC]
  const int cvn = C / VEC;
  const int tiles = (cvn + lanes - 1) / lanes;
  const i64 n = blockIdx.x / tiles;
  const ChannelTile t = channel_lanes<BLOCK>(cvn, lanes, blockIdx.x % tiles);
  const int begin = blockIdx.y * pchunk, end = min(hw, begin + pchunk);
  float a[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] = 0.f;
  if (t.live) {
    const elem_t* xp = x + n * hw * C + t.cv * VEC;
    for (int p = begin + t.ty; p < end; p += t.rb) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xp + (i64)p * C, f);
      vec_add_into(a, f);
    }
  }
  fold_row_lanes<BLOCK, VEC>(sacc, t, a, 0.f, add_float, [&](const float (&total)[VEC]) {
    float* o = part + (n * gridDim.y + blockIdx.y) * C + t.cv * VEC;
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = total[i];
  });
}

__global__ void __launch_bounds__(128)
gap_split_rows_fin(const float* __restrict__ part, elem_t* __restrict__ y, int N, int S, int C,
                   int hw) {
  const i64 idx = (i64)blockIdx.x * 128 + threadIdx.x;  // n * C + c
  if (idx >= (i64)N * C) return;
  const i64 n = idx / C;
  const int c = (int)(idx % C);
  float s = 0.f;
  for (int i = 0; i < S; ++i) s += part[(n * S + i) * C + c];
  y[idx] = from_float<elem_t>(s / (float)hw);
}
