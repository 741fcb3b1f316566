// batch_norm training backward with the forward's saved mean / invstd (fp32 (C,)):
//   xhat = (x - mean) * invstd, dweight = sum(dy * xhat), dbias = sum(dy) over (N, H, W),
//   dx = w * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M)
//      = a dy + b (x - mean) + c0  (x - mean per element, as the sums take it: folding b mean
//        into c0 would cancel b x against it and lose the bits of mean / std).
// Two launches, dy and x read twice:
//   bn_bwd_reduce_{planes,rows}: partial (sum dy, sum dy * (x - mean)) per (split, channel)
//     (split-major: part[(s * C + c) * 2 + {0, 1}]); the last block of each channel tile to
//     finish folds the tile's partials in a fixed order (<dnnctl/lastblock.cuh>) and writes
//     dweight / dbias and the dx coefficients (a, b, c0) of its channels;
//   bn_bwd_dx: a vector stream over dy and x (and the channel's mean) writing dx, from the
//     end when REV.
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT (0 NCHW, 1 NHWC), BN_ACT (1: relu(batch_norm(x)), the
// coefficients then also hold the mask's scale and beta), BN_RESID (1: relu(batch_norm(x) +
// z), ResNet's block end: both kernels read z for the mask, the dx pass also writes dz, the
// gated dy; z and dz are the kernels' last arguments, null otherwise). Host: the channel's inner extent
// (hw for NCHW, C for NHWC) % VEC == 0 and VEC-aligned x / dy / dx (else VEC = 1); the
// counters (one int per tile) zero before the first launch (each launch leaves them zero).
#include <dnnctl/bn_backward.cuh>
#include <dnnctl/chanreduce.cuh>

using namespace dnnctl;

// NCHW: grid (C, S); a block walks vectors k = s*BLOCK + t, stride S*BLOCK, of the channel's
// N planes (N * hw / VEC vectors).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                     const float* __restrict__ mean, float* __restrict__ part, int* counter,
                     int N, int C, int hw, const float* __restrict__ invstd,
                     const float* __restrict__ w, float* __restrict__ dw,
                     float* __restrict__ db, float* __restrict__ coef,
                     const float* __restrict__ bias, const elem_t* __restrict__ z) {
  __shared__ float red[32];
  __shared__ int flag;
  const int c = blockIdx.x;
  const float m = mean[c];
  const float rs = BN_ACT ? bn_relu_scale(invstd, w, c) : 0.f;
  const float rb = BN_ACT ? bn_relu_beta(bias, c) : 0.f;
  float2 s = make_float2(0.f, 0.f);
  for_channel_vecs<BLOCK, VEC>(N, C, c, hw / VEC, [&](i64 off) {
    float g[VEC], v[VEC], r[VEC];
    load_pair(dy, x, off, g, v);
    if (BN_RESID) load_vec<LD_NC, VEC>(z + off, r);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float gi = bn_relu_gate(g[i], v[i], m, rs, rb, BN_RESID ? r[i] : 0.f);
      s.x += gi;
      s.y += gi * (v[i] - m);
    }
  });
  if (!fold_plane_pairs<BLOCK>(s, part, counter, C, c, red, &flag)) return;
  if (threadIdx.x == 0)
    bn_bwd_finish(c, C, s.x, s.y, (float)((i64)N * hw), invstd, w, dw, db, coef, bias);
}

// NHWC: x as M rows of C; grid (S, tiles). A tile is TB bytes of a row (128: a warp reads
// several rows' 128-byte lines; 512: up to a whole row of 256 fp16 channels per warp, so DRAM
// sees longer runs): TX = min(C / VEC, TB / (VEC * sizeof(elem_t)), BLOCK) channel-vector
// lanes by RB = BLOCK / TX rows, folded through shared memory (2 * BLOCK * VEC floats, dynamic):
// <dnnctl/chanreduce.cuh>. A trip loads U rows gridDim.x * RB apart (U pairs in flight).
template <int BLOCK, int VEC, int U, int TB>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                   const float* __restrict__ mean, float* __restrict__ part, int* counter,
                   i64 M, int C, const float* __restrict__ invstd, const float* __restrict__ w,
                   float* __restrict__ dw, float* __restrict__ db, float* __restrict__ coef,
                   const float* __restrict__ bias, const elem_t* __restrict__ z) {
  DNNCTL_DYN_SMEM(float, sw);  // [BLOCK][VEC] pairs
  __shared__ int flag;
  constexpr int TB_LANES = TB / (VEC * (int)sizeof(elem_t)) > 0
                               ? TB / (VEC * (int)sizeof(elem_t)) : 1;
  constexpr int TXW = TB_LANES < BLOCK ? TB_LANES : BLOCK;
  const ChannelTile t = channel_tile<BLOCK>(C / VEC, TXW);
  float m[VEC], rs[VEC], rb[VEC];
  float2 s[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = t.cv * VEC + i;
    m[i] = t.live ? mean[c] : 0.f;
    rs[i] = BN_ACT && t.live ? bn_relu_scale(invstd, w, c) : 0.f;
    rb[i] = BN_ACT && t.live ? bn_relu_beta(bias, c) : 0.f;
    s[i] = make_float2(0.f, 0.f);
  }
  if (t.live) {
    const i64 stride = (i64)gridDim.x * t.rb;
    const elem_t* dyc = dy + t.cv * VEC;
    const elem_t* xc = x + t.cv * VEC;
    const elem_t* zc = BN_RESID ? z + t.cv * VEC : nullptr;
    for (i64 r0 = (i64)blockIdx.x * t.rb + t.ty; r0 < M; r0 += stride * U) {
      float g[U][VEC], v[U][VEC], zr[BN_RESID ? U : 1][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 r = r0 + u * stride;
        if (r < M) {
          load_pair(dyc, xc, r * C, g[u], v[u]);
          if (BN_RESID) load_vec<LD_NC, VEC>(zc + r * C, zr[BN_RESID ? u : 0]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r0 + u * stride < M) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float gi = bn_relu_gate(g[u][i], v[u][i], m[i], rs[i], rb[i],
                                          BN_RESID ? zr[BN_RESID ? u : 0][i] : 0.f);
            s[i].x += gi;
            s[i].y += gi * (v[u][i] - m[i]);
          }
        }
      }
    }
  }
  constexpr int CT = TXW * VEC;  // channels of a full tile (the last tile may hold fewer)
  const int c0 = blockIdx.y * t.tx_n * VEC;
  if (!fold_row_pairs<BLOCK, VEC, CT>(sw, t, s, part, counter, C, c0, &flag)) return;
  for (int j = threadIdx.x; j < t.tx_n * VEC && c0 + j < C; j += BLOCK)
    bn_bwd_finish(c0 + j, C, sw[j], sw[CT + j], (float)M, invstd, w, dw, db, coef, bias);
}

// A grid-stride vector stream, two vectors of dy and x in flight per thread, walking the
// vectors from the end when REV (what the reduction read last, still in L2, is read first);
// vector k holds VEC consecutive channels from (k * VEC) % C (NHWC) or the one channel
// (k * VEC / hw) % C (NCHW). NHWC: when the grid's stride covers whole rows ((stride * VEC) % C == 0) a thread's
// vectors all hold the same channels and their coefficients are read once; otherwise once
// per vector (planar arrays: a warp reads them contiguously), never an index per element.
template <int BLOCK, int VEC, typename I, int REV>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
          const float* __restrict__ mean, const float* __restrict__ coef,
          elem_t* __restrict__ dx, I nvec, int C, int hw, const elem_t* __restrict__ z,
          elem_t* __restrict__ dz) {
  constexpr int U = 2;
  constexpr int PV = LAYOUT ? VEC : 1;  // channels of a vector
  const I stride = (I)gridDim.x * BLOCK;
  const I k_first = (I)blockIdx.x * BLOCK + threadIdx.x;
  float a[PV], b[PV], c0[PV], m[PV], rs[PV], rb[PV];
  auto params = [&](I k) {
    const int cb = LAYOUT ? (int)((k * VEC) % C) : (int)((k * VEC / hw) % C);
#pragma unroll
    for (int i = 0; i < PV; ++i) {
      a[i] = __ldg(coef + cb + i);
      b[i] = __ldg(coef + C + cb + i);
      c0[i] = __ldg(coef + 2 * C + cb + i);
      m[i] = __ldg(mean + cb + i);
      rs[i] = BN_ACT ? __ldg(coef + 3 * C + cb + i) : 0.f;
      rb[i] = BN_ACT ? __ldg(coef + 4 * C + cb + i) : 0.f;
    }
  };
  const bool same = LAYOUT && (stride * VEC) % C == 0;
  if (same && k_first < nvec) params(REV ? nvec - 1 - k_first : k_first);
  for (I k0 = k_first; k0 < nvec; k0 += stride * U) {
    float g[U][VEC], v[U][VEC], zr[BN_RESID ? U : 1][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I k = k0 + u * stride;
      if (k < nvec) {
        load_pair(dy, x, (REV ? nvec - 1 - k : k) * VEC, g[u], v[u]);
        if (BN_RESID) load_vec<LD_NC, VEC>(z + (REV ? nvec - 1 - k : k) * VEC,
                                           zr[BN_RESID ? u : 0]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I kf = k0 + u * stride;
      if (kf >= nvec) break;
      const I k = REV ? nvec - 1 - kf : kf;
      if (!same) params(k);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const int j = LAYOUT ? i : 0;
        const float gi = bn_relu_gate(g[u][i], v[u][i], m[j], rs[j], rb[j],
                                      BN_RESID ? zr[BN_RESID ? u : 0][i] : 0.f);
        if (BN_RESID) zr[BN_RESID ? u : 0][i] = gi;  // the residual's gradient
        g[u][i] = a[j] * gi + b[j] * (v[u][i] - m[j]) + c0[j];
      }
      store_vec<ST_PLAIN, VEC>(dx + k * VEC, g[u]);
      if (BN_RESID) store_vec<ST_PLAIN, VEC>(dz + k * VEC, zr[BN_RESID ? u : 0]);
    }
  }
}
