// batch_norm training forward in two launches, x read twice:
//   1. bnt_stats_{rows,planes}: U independent vector loads in flight per thread, per-thread
//      sums shifted by the channel's first value x[0, c] (one shift for every block of a
//      channel, so partials are plain sums: no division when they are folded, and no
//      cancellation when |mean| >> std), one partial (s1, s2) per (channel, split). The last
//      block of a channel tile to finish (a counter per tile, after a fence) folds the
//      tile's partials in a fixed order with the whole block (deterministic) and writes
//      save_mean, save_invstd, the running statistics (momentum, unbiased variance; the
//      running arrays may alias the new ones) and scale = weight * invstd; it then resets the
//      counter for the next call (<dnnctl/lastblock.cuh>). No separate finalize launch, no
//      grid-wide barrier (blocks need not be co-resident).
//   2. the exact-grid normalize of <dnnctl/bn_exact.cuh> walking x from its end (REV), so
//      that what the statistics read last, still in L2, is read first.
// Workspace: part (S * C * 2 floats), scale (C floats), counters (one int per tile, zero).
// Defines: DNNCTL_DTYPE, AFFINE, PARAMS=1, LAYOUT, CH, HW.
#include <dnnctl/bn_exact.cuh>
#include <dnnctl/bn_finish.cuh>
#include <dnnctl/chanreduce.cuh>

// NHWC: x as M rows of CH channels; grid (S, tiles). A tile is TB bytes of a row: TX =
// min(CH / VEC, TB / (VEC * sizeof(elem_t)), BLOCK) channel-vector lanes by RB = BLOCK / TX
// rows (128: a warp still reads whole 128-byte lines, and a tile's last block folds few
// channels of few partials; 512: a warp reads up to a whole row of 256 fp16 channels); a trip loads U rows gridDim.x * RB apart. Partials are split-major
// (part[(s * CH + c) * 2 + {0, 1}]): the fold reads them coalesced. Dynamic shared memory:
// 2 * BLOCK * VEC floats.
template <int BLOCK, int VEC, int U, int TB>
__global__ void __launch_bounds__(BLOCK)
bnt_stats_rows(const elem_t* __restrict__ x, float* __restrict__ part, int* counter, i64 M,
               BNT_OUT_PARAMS) {
  DNNCTL_DYN_SMEM(float, sw);  // [BLOCK][VEC] pairs
  __shared__ int flag;
  constexpr int TB_LANES = TB / (VEC * (int)sizeof(elem_t)) > 0
                               ? TB / (VEC * (int)sizeof(elem_t)) : 1;
  constexpr int TXW = TB_LANES < BLOCK ? TB_LANES : BLOCK;
  constexpr int TX = CH / VEC < TXW ? CH / VEC : TXW;
  const ChannelTile t = channel_tile<BLOCK>(CH / VEC, TXW);
  float k[VEC];
  float2 s[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) s[i] = make_float2(0.f, 0.f);
  if (t.live) load_vec<LD_NC, VEC>(x + t.cv * VEC, k);
  const i64 stride = (i64)gridDim.x * t.rb;
  if (t.live) {
    for (i64 r0 = (i64)blockIdx.x * t.rb + t.ty; r0 < M; r0 += stride * U) {
      load_unrolled<U, VEC, LD_NC>(x + t.cv * VEC, (i64)CH, r0, stride, M, [&](i64, auto& f) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = f[i] - k[i];
          s[i].x += d;
          s[i].y += d * d;
        }
      });
    }
  }
  constexpr int CT = TX * VEC;
  const int c0 = blockIdx.y * CT;
  if (!fold_row_pairs<BLOCK, VEC, CT>(sw, t, s, part, counter, CH, c0, &flag)) return;
  for (int j = threadIdx.x; j < CT && c0 + j < CH; j += BLOCK)
    bnt_finish(c0 + j, to_float(x[c0 + j]), sw[j], sw[CT + j], (float)M, BNT_OUT_ARGS);
}

// NCHW: grid (C, S); a block walks vectors k = s * BLOCK + t (U at once, gridDim.y * BLOCK
// apart) of the channel's N planes (N * HW / VEC vectors).
template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
bnt_stats_planes(const elem_t* __restrict__ x, float* __restrict__ part, int* counter, int N,
                 BNT_OUT_PARAMS) {
  __shared__ float red[32];
  __shared__ int flag;
  constexpr int NV = HW / VEC;
  const int c = blockIdx.x;
  const float k = to_float(x[(i64)c * HW]);
  const i64 total = (i64)N * NV;
  const i64 stride = (i64)gridDim.y * BLOCK;
  float2 s = make_float2(0.f, 0.f);
  for (i64 k0 = (i64)blockIdx.y * BLOCK + threadIdx.x; k0 < total; k0 += stride * U) {
    float f[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 kk = k0 + u * stride;
      if (kk < total) {
        const i64 n = kk / NV;
        load_vec<LD_NC, VEC>(x + ((n * CH + c) * NV + (kk - n * NV)) * VEC, f[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (k0 + u * stride < total) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = f[u][i] - k;
          s.x += d;
          s.y += d * d;
        }
      }
    }
  }
  if (!fold_plane_pairs<BLOCK>(s, part, counter, CH, c, red, &flag)) return;
  if (threadIdx.x == 0) {
    bnt_finish(c, k, s.x, s.y, (float)total * VEC, BNT_OUT_ARGS);
  }
}
