// The persistent (cooperative) channel reductions of NHWC rows (kernels/norm/bn_persist.cu,
// bn_bwd_persist.cu): what every block holds of the tensor is staged in shared memory, per-
// channel sums are folded block by block, then across the grid after a grid barrier, in a
// fixed order (deterministic), and every thread goes on with the rows it staged.
//
// Geometry (the host keeps it): a block is L = min(CH / VEC, BLOCK) channel-vector lanes by
// RB = BLOCK / L rows, BLOCK % L == 0 and (CH / VEC) % L == 0; grid (S, TILES); thread
// (lane lc, row rr) of block (s, tile) holds channels (tile * L + lc) * VEC .. + VEC - 1 of
// rows (s * RB + rr) + u * S * RB, u < R.
#pragma once
#include <dnnctl/grid_sync.cuh>
#include <dnnctl/memory.cuh>

namespace dnnctl {

template <int BLOCK, int VEC, int CHANNELS>
struct PersistRows {
  static constexpr int CV = CHANNELS / VEC;
  static constexpr int L = CV < BLOCK ? CV : BLOCK;
  static constexpr int RB = BLOCK / L;
  static constexpr int TW = L * VEC;  // channels of a tile
  static_assert(BLOCK % L == 0 && CV % L == 0 && BLOCK % 32 == 0, "whole channel tiles");

  int lc, rr, c0;
  i64 step, r0;

  __device__ __forceinline__ PersistRows() {
    lc = threadIdx.x % L;
    rr = threadIdx.x / L;
    c0 = (blockIdx.y * L + lc) * VEC;
    step = (i64)gridDim.x * RB;
    r0 = (i64)blockIdx.x * RB + rr;
  }

  __device__ __forceinline__ i64 row(int u) const { return r0 + u * step; }

  // The block's sums per channel (its RB rows of threads, in a fixed order through `red`,
  // 2 * BLOCK * VEC floats) as one (s1, s2) partial per (channel, split):
  // part[split * CHANNELS + c].
  __device__ __forceinline__ void block_partials(const float (&s1)[VEC],
                                                 const float (&s2)[VEC], float* red,
                                                 float* part) const {
    float2* out = reinterpret_cast<float2*>(part) + (i64)blockIdx.x * CHANNELS;
    if (RB > 1) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        DNNCTL_DEREF_ST(&red[rr * TW + lc * VEC + i], s1[i]);
        DNNCTL_DEREF_ST(&red[(RB + rr) * TW + lc * VEC + i], s2[i]);
      }
      __syncthreads();
      for (int j = threadIdx.x; j < TW; j += BLOCK) {
        float a = 0.f, q = 0.f;
        for (int r = 0; r < RB; ++r) {  // fixed order
          a += DNNCTL_DEREF_LD(&red[r * TW + j]);
          q += DNNCTL_DEREF_LD(&red[(RB + r) * TW + j]);
        }
        DNNCTL_DEREF_ST(out + blockIdx.y * TW + j, make_float2(a, q));
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) DNNCTL_DEREF_ST(out + c0 + i, make_float2(s1[i], s2[i]));
    }
  }

  // Grid barrier, then a warp per channel (the grid's warps, channels strided) folds the
  // channel's S partials in a fixed order (lanes stride the splits, then a shuffle tree:
  // lane 0's sum is deterministic) and lane 0 calls finish(c, s1, s2); grid barrier again,
  // after which every block may read what finish wrote (coherent loads: __ldcg).
  template <typename F>
  __device__ __forceinline__ void fold_splits(const float* part, unsigned long long* counter,
                                              F&& finish) const {
    grid_sync(counter);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warps = (int)(gridDim.x * gridDim.y) * (BLOCK / 32);
    const int gw = (int)(blockIdx.y * gridDim.x + blockIdx.x) * (BLOCK / 32) + warp;
    const float2* pp = reinterpret_cast<const float2*>(part);
    for (int c = gw; c < CHANNELS; c += warps) {
      float a = 0.f, q = 0.f;
      for (int s = lane; s < (int)gridDim.x; s += 32) {
        const float2 v = __ldcg(pp + (i64)s * CHANNELS + c);
        a += v.x;
        q += v.y;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        a += shfl_xor(a, o);
        q += shfl_xor(q, o);
      }
      if (lane == 0) finish(c, a, q);
    }
    grid_sync(counter);
  }
};

}  // namespace dnnctl
