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
// Grid and folds: <dnnctl/persist_rows.cuh> (the host keeps S * RB * R >= M).
// Dynamic shared memory: R * BLOCK vectors of x, then (RB > 1) 2 * BLOCK * VEC floats.
// Workspace: part (S * CH * 2 floats), scale (CH floats), the barrier counter (zeroed once).
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT=1, CH, BN_ACT, BN_RESID.
#include <dnnctl/bn_epilogue.cuh>
#include <dnnctl/bn_finish.cuh>
#include <dnnctl/persist_rows.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int R>
__global__ void __launch_bounds__(BLOCK)
bn_persist_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, float* part,
                unsigned long long* counter, i64 M, BNT_OUT_PARAMS,
                const float* __restrict__ b, const elem_t* __restrict__ z) {
  const PersistRows<BLOCK, VEC, CH> g;
  DNNCTL_DYN_SMEM(elem_t, xs);  // [R][BLOCK] vectors, then the fold's [2][RB][L * VEC] floats
  float* red = reinterpret_cast<float*>(xs + R * BLOCK * VEC);
  const int c0 = g.c0;
  auto at = [&](int u) { return xs + (u * BLOCK + threadIdx.x) * VEC; };

  // 1. x staged, shifted sums (each thread reads back only what it staged: no barrier)
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (g.row(u) < M) stage_vec<VEC>(at(u), x + g.row(u) * CH + c0);
  stage_wait();
  float k[VEC];
  load_vec<LD_NC, VEC>(x + c0, k);
  float s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) s1[i] = s2[i] = 0.f;
#pragma unroll
  for (int u = 0; u < R; ++u) {
    if (g.row(u) < M) {
      float f[VEC];
      load_vec<LD_PLAIN, VEC>(at(u), f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float d = f[i] - k[i];
        s1[i] += d;
        s2[i] += d * d;
      }
    }
  }
  g.block_partials(s1, s2, red, part);

  // 2. the splits folded a warp per channel, between two grid barriers
  g.fold_splits(part, counter, [&](int c, float a, float q) {
    bnt_finish(c, to_float(x[c]), a, q, (float)M, BNT_OUT_ARGS);
  });

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
    const i64 row = g.row(u);
    if (row < M) {
      float v[VEC];
      load_vec<LD_PLAIN, VEC>(at(u), v);
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
