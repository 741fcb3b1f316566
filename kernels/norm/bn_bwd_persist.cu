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
// Grid and folds: <dnnctl/persist_rows.cuh>.
// Dynamic shared memory: (2 + BN_RESID) * R * BLOCK vectors, then (RB > 1) 2 * BLOCK * VEC
// floats. Workspace: part (S * CH * 2 floats), coef (5 * CH floats), the barrier counter.
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT=1, CH, BN_ACT, BN_RESID.
#include <dnnctl/bn_backward.cuh>
#include <dnnctl/persist_rows.cuh>
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
  constexpr int NT = 2 + BN_RESID;  // staged tensors: dy, x (, z)
  const PersistRows<BLOCK, VEC, CH> g;
  DNNCTL_DYN_SMEM(elem_t, st);  // [NT][R][BLOCK] vectors, then the fold's floats
  float* red = reinterpret_cast<float*>(st + NT * R * BLOCK * VEC);
  const int c0 = g.c0;
  auto at = [&](int t, int u) { return st + ((t * R + u) * BLOCK + threadIdx.x) * VEC; };
  float m[VEC], rs[VEC], rb[VEC];
  // vector u's gated dy (the fused ReLU's mask recomputed from x) and x
  auto staged = [&](int u, float (&gi)[VEC], float (&v)[VEC]) {
    float zr[BN_RESID ? VEC : 1];
    load_vec<LD_PLAIN, VEC>(at(0, u), gi);
    load_vec<LD_PLAIN, VEC>(at(1, u), v);
    if (BN_RESID) load_vec<LD_PLAIN, BN_RESID ? VEC : 1>(at(NT - 1, u), zr);
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      gi[i] = bn_relu_gate(gi[i], v[i], m[i], rs[i], rb[i], BN_RESID ? zr[BN_RESID ? i : 0] : 0.f);
  };

  // 1. dy, x (, z) staged; sums of the gated dy and dy * (x - mean)
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const i64 row = g.row(u);
    if (row < M) {
      stage_vec<VEC>(at(0, u), dy + row * CH + c0);
      stage_vec<VEC>(at(1, u), x + row * CH + c0);
      if (BN_RESID) stage_vec<VEC>(at(NT - 1, u), z + row * CH + c0);
    }
  }
  stage_wait();
  float s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    m[i] = mean[c0 + i];
    rs[i] = BN_ACT ? bn_relu_scale(invstd, w, c0 + i) : 0.f;
    rb[i] = BN_ACT ? bn_relu_beta(bias, c0 + i) : 0.f;
    s1[i] = s2[i] = 0.f;
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    if (g.row(u) < M) {
      float gi[VEC], v[VEC];
      staged(u, gi, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        s1[i] += gi[i];
        s2[i] += gi[i] * (v[i] - m[i]);
      }
    }
  }
  g.block_partials(s1, s2, red, part);

  // 2. the splits folded a warp per channel, between two grid barriers
  g.fold_splits(part, counter, [&](int c, float a, float q) {
    bn_bwd_finish(c, CH, a, q, (float)M, invstd, w, dw, db, coef, bias);
  });

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
    const i64 row = g.row(u);
    if (row < M) {
      float gi[VEC], v[VEC];
      staged(u, gi, v);
      if (BN_RESID) store_vec<ST_PLAIN, VEC>(dz + row * CH + c0, gi);  // the residual's gradient
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = ca[i] * gi[i] + cb[i] * (v[i] - m[i]) + cc[i];
      store_vec<ST_PLAIN, VEC>(dx + row * CH + c0, v);
    }
  }
}
