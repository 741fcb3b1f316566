// Per-channel (or per-column) reductions over many rows: the batch_norm training and backward
// kernels (kernels/norm/bn_{train,stream,onepass,backward}.cu), the fused bias gradient of
// activation backward, global average pooling (kernels/pool/gap_*.cu, via <dnnctl/gap.cuh>)
// and the weight-gradient column passes of group_norm / layer_norm backward:
//   * NCHW, grid (C, S splits): for_channel_vecs walks a channel's vectors;
//   * NHWC, x as M rows of C channels, grid (S, channel tiles): a block is TX channel-vector
//     lanes by RB row lanes (ChannelTile, for_tile_rows); the RB partials of a channel fold
//     through shared memory (fold_row_lanes, fold_row_welford);
//   * sum pairs (s1, s2) per (split, channel) in split-major partials
//     part[(s * C + c) * 2 + {0, 1}], folded by the last block of a channel (tile) to finish
//     (<dnnctl/lastblock.cuh>): fold_plane_pairs (NCHW) and fold_row_pairs (NHWC).
#pragma once
#include <dnnctl/lastblock.cuh>

namespace dnnctl {

// NCHW, grid (C, S): the vectors of channel c over its `outer` planes of nv vectors, block
// (c, s) taking k = s * BLOCK + t, stride S * BLOCK; fn(off), off the vector's first element.
template <int BLOCK, int VEC, typename F>
__device__ __forceinline__ void for_channel_vecs(i64 outer, int C, int c, int nv, F&& fn) {
  const i64 total = outer * nv;
  for (i64 k = (i64)blockIdx.y * BLOCK + threadIdx.x; k < total; k += (i64)gridDim.y * BLOCK) {
    const i64 n = k / nv;
    fn(((n * C + c) * nv + (k - n * nv)) * VEC);
  }
}

// NHWC work split of a block: TX channel-vector lanes (tile `tile` of the cvn = C / VEC
// channel vectors) by RB = BLOCK / TX row lanes. `live`: the thread has a row lane and a
// channel vector cv < cvn.
struct ChannelTile {
  int tx_n, rb, tx, ty, cv;
  bool live;
};

template <int BLOCK>
__device__ __forceinline__ ChannelTile channel_lanes(int cvn, int lanes, int tile) {
  ChannelTile t;
  t.tx_n = lanes;
  t.rb = BLOCK / lanes;
  t.tx = threadIdx.x % lanes;
  t.ty = threadIdx.x / lanes;
  t.cv = tile * lanes + t.tx;
  t.live = t.ty < t.rb && t.cv < cvn;
  return t;
}

// TX = min(cvn, width) lanes, channel tile blockIdx.y.
template <int BLOCK>
__device__ __forceinline__ ChannelTile channel_tile(int cvn, int width) {
  return channel_lanes<BLOCK>(cvn, min(cvn, width), blockIdx.y);
}

// fn(r) for the rows r = blockIdx.x * RB + ty, stride gridDim.x * RB, of a live thread's
// channel vector (x as M rows).
template <typename F>
__device__ __forceinline__ void for_tile_rows(const ChannelTile& t, i64 M, F&& fn) {
  if (!t.live) return;
  for (i64 r = (i64)blockIdx.x * t.rb + t.ty; r < M; r += (i64)gridDim.x * t.rb) fn(r);
}

// The VEC per-channel partials `mine` of every thread folded over the RB row lanes, through
// shared memory `sw` (BLOCK * VEC values of T), in row-lane order from `zero` by `combine`;
// out(totals) then runs on the first row lane of each live channel vector, totals[i] for
// channel cv * VEC + i. The whole block calls it (one barrier).
template <int BLOCK, int VEC, typename T, typename Combine, typename Out>
__device__ __forceinline__ void fold_row_lanes(T* sw, const ChannelTile& t, const T (&mine)[VEC],
                                               T zero, Combine&& combine, Out&& out) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) sw[threadIdx.x * VEC + i] = mine[i];
  sync_block();
  if (t.ty != 0 || !t.live) return;
  T total[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    T a = zero;
    for (int r = 0; r < t.rb; ++r) a = combine(a, sw[(r * t.tx_n + t.tx) * VEC + i]);
    total[i] = a;
  }
  out(total);
}

// Welford partials `mine` folded over the row lanes and written per (channel, split
// blockIdx.x): part[(c * gridDim.x + blockIdx.x) * 3 + {0, 1, 2}] = (n, mean, M2). sw: shared
// memory of BLOCK * VEC Welfords.
template <int BLOCK, int VEC>
__device__ __forceinline__ void fold_row_welford(Welford* sw, const ChannelTile& t,
                                                 const Welford (&mine)[VEC], float* part) {
  fold_row_lanes<BLOCK, VEC>(sw, t, mine, welford_init(), welford_combine,
                             [&](const Welford (&total)[VEC]) {
#pragma unroll
                               for (int i = 0; i < VEC; ++i) {
                                 const i64 c = t.cv * VEC + i;
                                 welford_store(part + (c * gridDim.x + blockIdx.x) * 3, total[i]);
                               }
                             });
}

// Sums: the combine of fold_row_lanes for float partials.
__device__ __forceinline__ float add_float(float a, float b) { return a + b; }

__device__ __forceinline__ float2 add_pair(float2 a, float2 b) {
  return make_float2(a.x + b.x, a.y + b.y);
}

// NCHW, grid (C, S): the block's sums s of channel c become partial pair blockIdx.y; true in
// the last block of the channel to finish, where s then holds the channel's totals (every
// thread), folded in a fixed order. `red`: >= 32 shared floats; `flag`: a shared int.
template <int BLOCK>
__device__ __forceinline__ bool fold_plane_pairs(float2& s, float* part, int* counter, int C,
                                                 int c, float* red, int* flag) {
  s.x = block_sum<BLOCK / 32>(s.x, red);
  s.y = block_sum<BLOCK / 32>(s.y, red);
  if (threadIdx.x == 0) {
    part[((i64)blockIdx.y * C + c) * 2] = s.x;
    part[((i64)blockIdx.y * C + c) * 2 + 1] = s.y;
  }
  if (!last_block_of_tile(counter, c, gridDim.y, flag)) return false;
  s = make_float2(0.f, 0.f);
  for (int k = threadIdx.x; k < (int)gridDim.y; k += BLOCK) {
    s.x += __ldcg(part + ((i64)k * C + c) * 2);
    s.y += __ldcg(part + ((i64)k * C + c) * 2 + 1);
  }
  s.x = block_sum<BLOCK / 32>(s.x, red);
  s.y = block_sum<BLOCK / 32>(s.y, red);
  return true;
}

// NHWC, grid (S, channel tiles): each thread's sum pairs `mine` of its VEC channels folded over
// the row lanes into partial pair blockIdx.x; true in the last block of the channel tile to
// finish, where fold_tile left the totals of channel c0 + j (c0 = the tile's first channel,
// j < CT) in sw[j] and sw[CT + j]. sw: shared memory of 2 * BLOCK * VEC (>= 2 * CT) floats.
template <int BLOCK, int VEC, int CT>
__device__ __forceinline__ bool fold_row_pairs(float* sw, const ChannelTile& t,
                                               const float2 (&mine)[VEC], float* part,
                                               int* counter, int C, int c0, int* flag) {
  fold_row_lanes<BLOCK, VEC>(reinterpret_cast<float2*>(sw), t, mine, make_float2(0.f, 0.f),
                             add_pair, [&](const float2 (&total)[VEC]) {
#pragma unroll
                               for (int i = 0; i < VEC; ++i) {
                                 float* o = part + ((i64)blockIdx.x * C + t.cv * VEC + i) * 2;
                                 o[0] = total[i].x;
                                 o[1] = total[i].y;
                               }
                             });
  if (!last_block_of_tile(counter, blockIdx.y, gridDim.x, flag)) return false;
  fold_tile<BLOCK, CT>(part, gridDim.x, C, c0, sw);
  return true;
}

}  // namespace dnnctl
