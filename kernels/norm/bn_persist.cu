// batch_norm training forward in one cooperative launch, x read once (NHWC):
//   1. every thread stages its R vectors of x (one channel vector, rows gridDim.x * RB apart)
//      into shared memory (cp.async: all of them in flight at once), then sums them, shifted by the channel's first value x[0, c] (one shift
//      for every block, so partials are plain sums); the block folds its rows per channel in
//      a fixed order and writes one partial (s1, s2) per (channel, split);
//   2. grid barrier; a warp per channel (all the grid's warps, channels strided) folds the
//      channel's partials in a fixed order (lanes stride the splits, then a shuffle tree:
//      deterministic) and writes save_mean, save_invstd, the running statistics and
//      scale = weight * invstd (<dnnctl/bn_finish.cuh>);
//   3. grid barrier; every thread normalizes the vectors it staged and writes y (optional
//      fused residual and ReLU, as bn_exact).
// x costs one read instead of two, and there is one launch, no tail of a second: what the
// small and mid-sized layers lose to launch and fold latency. Every block must be resident
// at once (the host sizes the grid from the occupancy calculator and launches it
// cooperatively), so x must fit in the shared memory of the resident blocks (~30 MB on
// an H100 / H200).
// Grid (S, TILES): a tile is L = min(CH / VEC, BLOCK) channel vectors by RB = BLOCK / L rows
// (the host keeps BLOCK % L == 0 and (CH / VEC) % L == 0); a thread's rows are
// r0 + u * S * RB, u < R, with S * RB * R >= M.
// Dynamic shared memory: R * BLOCK vectors of x, then (RB > 1) 2 * BLOCK * VEC floats.
// Workspace: part (S * CH * 2 floats), scale (CH floats), the barrier counter (zeroed once).
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT=1, CH, BN_ACT, BN_RESID.
#include <dnnctl/bn_finish.cuh>
#include <dnnctl/grid_sync.cuh>
#include <dnnctl/stage.cuh>

#ifndef BN_ACT
#define BN_ACT 0
#endif
#ifndef BN_RESID
#define BN_RESID 0
#endif

using namespace dnnctl;

template <int BLOCK, int VEC, int R>
__global__ void __launch_bounds__(BLOCK)
bn_persist_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, float* part,
                unsigned long long* counter, i64 M, BNT_OUT_PARAMS,
                const float* __restrict__ b, const elem_t* __restrict__ z) {
  constexpr int CV = CH / VEC;
  constexpr int L = CV < BLOCK ? CV : BLOCK;
  constexpr int RB = BLOCK / L;
  static_assert(BLOCK % L == 0 && CV % L == 0, "whole channel tiles");
  DNNCTL_DYN_SMEM(elem_t, xs);  // [R][BLOCK] vectors, then the fold's [2][RB][L * VEC] floats
  float* red = reinterpret_cast<float*>(xs + R * BLOCK * VEC);
  const int lc = threadIdx.x % L, rr = threadIdx.x / L;
  const int c0 = (blockIdx.y * L + lc) * VEC;
  const i64 step = (i64)gridDim.x * RB;
  const i64 r0 = (i64)blockIdx.x * RB + rr;

  // 1. x staged, shifted sums (each thread reads back only what it staged: no barrier)
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const i64 row = r0 + u * step;
    if (row < M) stage_vec<VEC>(xs + (u * BLOCK + threadIdx.x) * VEC, x + row * CH + c0);
  }
  stage_wait();
  float k[VEC];
  load_vec<LD_NC, VEC>(x + c0, k);
  float s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) s1[i] = s2[i] = 0.f;
#pragma unroll
  for (int u = 0; u < R; ++u) {
    if (r0 + u * step < M) {
      float f[VEC];
      load_vec<LD_PLAIN, VEC>(xs + (u * BLOCK + threadIdx.x) * VEC, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float d = f[i] - k[i];
        s1[i] += d;
        s2[i] += d * d;
      }
    }
  }
  constexpr int TW = L * VEC;  // channels of the tile
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
      float2* p = reinterpret_cast<float2*>(part) + (i64)blockIdx.x * CH + blockIdx.y * TW + j;
      DNNCTL_DEREF_ST(p, make_float2(a, q));
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      float2* p = reinterpret_cast<float2*>(part) + (i64)blockIdx.x * CH + c0 + i;
      DNNCTL_DEREF_ST(p, make_float2(s1[i], s2[i]));
    }
  }
  grid_sync(counter);

  // 2. a warp per channel folds the splits
  {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warps = (int)(gridDim.x * gridDim.y) * (BLOCK / 32);
    const int gw = (int)(blockIdx.y * gridDim.x + blockIdx.x) * (BLOCK / 32) + warp;
    const float2* pp = reinterpret_cast<const float2*>(part);
    for (int c = gw; c < CH; c += warps) {
      float a = 0.f, q = 0.f;
      for (int s = lane; s < (int)gridDim.x; s += 32) {
        const float2 v = __ldcg(pp + (i64)s * CH + c);
        a += v.x;
        q += v.y;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {  // a fixed tree: lane 0's sum is deterministic
        a += shfl_xor(a, o);
        q += shfl_xor(q, o);
      }
      if (lane == 0) bnt_finish(c, to_float(x[c]), a, q, (float)M, BNT_OUT_ARGS);
    }
  }
  grid_sync(counter);

  // 3. normalize what was staged
  float m[VEC], sc[VEC], beta[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    m[i] = __ldcg(save_mean + c0 + i);
    sc[i] = __ldcg(scale + c0 + i);
    beta[i] = AFFINE ? b[c0 + i] : 0.f;
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const i64 row = r0 + u * step;
    if (row < M) {
      float v[VEC];
      load_vec<LD_PLAIN, VEC>(xs + (u * BLOCK + threadIdx.x) * VEC, v);
      float r[BN_RESID ? VEC : 1];
      if (BN_RESID) load_vec<LD_NC, BN_RESID ? VEC : 1>(z + row * CH + c0, r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        v[i] = (v[i] - m[i]) * sc[i] + beta[i];
        if (BN_RESID) v[i] += r[BN_RESID ? i : 0];
        if (BN_ACT && v[i] < 0.f) v[i] = 0.f;
      }
      store_vec<ST_PLAIN, VEC>(y + row * CH + c0, v);
    }
  }
}
