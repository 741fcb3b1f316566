// batch_norm training backward in one cooperative launch, dy and x read once (NHWC):
//   1. every thread stages its R vectors of dy and x (and the residual z of a fused
//      relu(batch_norm(x) + z)) in shared memory (cp.async, all in flight at once), then sums
//      the gated dy and dy * (x - mean) per channel; the block folds its rows in a fixed order
//      and writes one partial per (channel, split);
//   2. grid barrier; a warp per channel (the grid's warps, channels strided) folds the splits
//      in a fixed order and writes dweight, dbias and the dx coefficients (a, b, c0 and the
//      mask's scale / beta) (<dnnctl/bn_backward.cuh>);
//   3. grid barrier; every thread writes dx = a g + b (x - mean) + c0 (and dz = g) for the
//      vectors it staged.
// Same arithmetic as bn_bwd_reduce_rows + bn_bwd_dx (kernels/norm/bn_backward.cu), with one
// read of dy and x instead of two and one launch. Every block must be resident at once
// (cooperative launch, grid sized by the host), so dy and x must fit in shared memory.
// Grid (S, TILES), tiles, rows and the fold as in kernels/norm/bn_persist.cu.
// Dynamic shared memory: (2 + BN_RESID) * R * BLOCK vectors, then (RB > 1) 2 * BLOCK * VEC
// floats. Workspace: part (S * CH * 2 floats), coef (5 * CH floats), the barrier counter.
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT=1, CH, BN_ACT, BN_RESID.
#include <dnnctl/bn_backward.cuh>
#include <dnnctl/grid_sync.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int R>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_persist_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                    const float* __restrict__ mean, float* part, unsigned long long* counter,
                    i64 M, const float* __restrict__ invstd, const float* __restrict__ w,
                    float* __restrict__ dw, float* __restrict__ db, float* coef,
                    const float* __restrict__ bias, const elem_t* __restrict__ z,
                    elem_t* __restrict__ dx, elem_t* __restrict__ dz) {
  constexpr int CV = CH / VEC;
  constexpr int L = CV < BLOCK ? CV : BLOCK;
  constexpr int RB = BLOCK / L;
  constexpr int NT = 2 + BN_RESID;  // staged tensors: dy, x (, z)
  static_assert(BLOCK % L == 0 && CV % L == 0, "whole channel tiles");
  DNNCTL_DYN_SMEM(elem_t, st);  // [NT][R][BLOCK] vectors, then the fold's floats
  float* red = reinterpret_cast<float*>(st + NT * R * BLOCK * VEC);
  const int lc = threadIdx.x % L, rr = threadIdx.x / L;
  const int c0 = (blockIdx.y * L + lc) * VEC;
  const i64 step = (i64)gridDim.x * RB;
  const i64 r0 = (i64)blockIdx.x * RB + rr;
  auto at = [&](int t, int u) { return st + ((t * R + u) * BLOCK + threadIdx.x) * VEC; };

  // 1. dy, x (, z) staged; sums of the gated dy and dy * (x - mean)
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const i64 row = r0 + u * step;
    if (row < M) {
      stage_vec<VEC>(at(0, u), dy + row * CH + c0);
      stage_vec<VEC>(at(1, u), x + row * CH + c0);
      if (BN_RESID) stage_vec<VEC>(at(NT - 1, u), z + row * CH + c0);
    }
  }
  stage_wait();
  float m[VEC], rs[VEC], rb[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    m[i] = mean[c0 + i];
    rs[i] = BN_ACT ? bn_relu_scale(invstd, w, c0 + i) : 0.f;
    rb[i] = BN_ACT ? bn_relu_beta(bias, c0 + i) : 0.f;
    s1[i] = s2[i] = 0.f;
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    if (r0 + u * step < M) {
      float g[VEC], v[VEC], zr[BN_RESID ? VEC : 1];
      load_vec<LD_PLAIN, VEC>(at(0, u), g);
      load_vec<LD_PLAIN, VEC>(at(1, u), v);
      if (BN_RESID) load_vec<LD_PLAIN, BN_RESID ? VEC : 1>(at(NT - 1, u), zr);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float gi = bn_relu_gate(g[i], v[i], m[i], rs[i], rb[i],
                                      BN_RESID ? zr[BN_RESID ? i : 0] : 0.f);
        s1[i] += gi;
        s2[i] += gi * (v[i] - m[i]);
      }
    }
  }
  constexpr int TW = L * VEC;
  if (RB > 1) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      DNNCTL_DEREF_ST(&red[rr * TW + lc * VEC + i], s1[i]);
      DNNCTL_DEREF_ST(&red[(RB + rr) * TW + lc * VEC + i], s2[i]);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < TW; j += BLOCK) {
      float a = 0.f, q = 0.f;
      for (int r = 0; r < RB; ++r) {
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
      for (int o = 16; o > 0; o >>= 1) {
        a += shfl_xor(a, o);
        q += shfl_xor(q, o);
      }
      if (lane == 0) bn_bwd_finish(c, CH, a, q, (float)M, invstd, w, dw, db, coef, bias);
    }
  }
  grid_sync(counter);

  // 3. dx (and dz) from what was staged
  float ca[VEC], cb[VEC], cc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    ca[i] = __ldcg(coef + c0 + i);
    cb[i] = __ldcg(coef + CH + c0 + i);
    cc[i] = __ldcg(coef + 2 * CH + c0 + i);
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const i64 row = r0 + u * step;
    if (row < M) {
      float g[VEC], v[VEC], zr[BN_RESID ? VEC : 1];
      load_vec<LD_PLAIN, VEC>(at(0, u), g);
      load_vec<LD_PLAIN, VEC>(at(1, u), v);
      if (BN_RESID) load_vec<LD_PLAIN, BN_RESID ? VEC : 1>(at(NT - 1, u), zr);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float gi = bn_relu_gate(g[i], v[i], m[i], rs[i], rb[i],
                                      BN_RESID ? zr[BN_RESID ? i : 0] : 0.f);
        if (BN_RESID) zr[BN_RESID ? i : 0] = gi;  // the residual's gradient
        g[i] = ca[i] * gi + cb[i] * (v[i] - m[i]) + cc[i];
      }
      store_vec<ST_PLAIN, VEC>(dx + row * CH + c0, g);
      if (BN_RESID) store_vec<ST_PLAIN, BN_RESID ? VEC : 1>(dz + row * CH + c0, zr);
    }
  }
}
