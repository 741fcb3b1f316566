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
//   bn_bwd_dx: a vector stream over dy and x (and the channel's mean) writing dx.
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT (0 NCHW, 1 NHWC). Host: the channel's inner extent
// (hw for NCHW, C for NHWC) % VEC == 0 and VEC-aligned x / dy / dx (else VEC = 1); the
// counters (one int per tile) zero before the first launch (each launch leaves them zero).
#include <dnnctl/lastblock.cuh>

#ifndef AFFINE
#define AFFINE 1
#endif
#ifndef LAYOUT
#define LAYOUT 0
#endif

using namespace dnnctl;

__device__ __forceinline__ void bn_bwd_finish(int c, float s1, float s2, float count,
                                              const float* invstd,
                                              const float* w, float* dw, float* db,
                                              float* coef) {
  const float is = invstd[c];
  if (AFFINE) {
    dw[c] = s2 * is;
    db[c] = s1;
  }
  const float a = AFFINE ? w[c] * is : is;
  const float b = -a * is * is * s2 / count;
  coef[c * 3] = a;
  coef[c * 3 + 1] = b;
  coef[c * 3 + 2] = -a * s1 / count;
}

// NCHW: grid (C, S); a block walks vectors k = s*BLOCK + t, stride S*BLOCK, of the channel's
// N planes (N * hw / VEC vectors).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                     const float* __restrict__ mean, float* __restrict__ part, int* counter,
                     int N, int C, int hw, const float* __restrict__ invstd,
                     const float* __restrict__ w, float* __restrict__ dw,
                     float* __restrict__ db, float* __restrict__ coef) {
  __shared__ float red[32];
  __shared__ int flag;
  const int c = blockIdx.x;
  const float m = mean[c];
  const int nv = hw / VEC;
  const i64 total = (i64)N * nv;
  float s1 = 0.f, s2 = 0.f;
  for (i64 k = (i64)blockIdx.y * BLOCK + threadIdx.x; k < total; k += (i64)gridDim.y * BLOCK) {
    const i64 n = k / nv;
    const i64 off = ((n * C + c) * nv + (k - n * nv)) * VEC;
    float g[VEC], v[VEC];
    load_vec<LD_NC, VEC>(dy + off, g);
    load_vec<LD_NC, VEC>(x + off, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      s1 += g[i];
      s2 += g[i] * (v[i] - m);
    }
  }
  s1 = block_sum<BLOCK / 32>(s1, red);
  s2 = block_sum<BLOCK / 32>(s2, red);
  if (threadIdx.x == 0) {
    part[((i64)blockIdx.y * C + c) * 2] = s1;
    part[((i64)blockIdx.y * C + c) * 2 + 1] = s2;
  }
  if (!last_block_of_tile(counter, c, gridDim.y, &flag)) return;
  float a = 0.f, b = 0.f;
  for (int s = threadIdx.x; s < (int)gridDim.y; s += BLOCK) {
    a += __ldcg(part + ((i64)s * C + c) * 2);
    b += __ldcg(part + ((i64)s * C + c) * 2 + 1);
  }
  a = block_sum<BLOCK / 32>(a, red);
  b = block_sum<BLOCK / 32>(b, red);
  if (threadIdx.x == 0) bn_bwd_finish(c, a, b, (float)total * VEC, invstd, w, dw, db, coef);
}

// NHWC: x as M rows of C; grid (S, tiles). A tile is 128 bytes of a row: TX = min(C / VEC,
// 128 / (VEC * sizeof(elem_t))) channel-vector lanes by RB = BLOCK / TX rows, folded through
// shared memory (2 * BLOCK * VEC floats, dynamic).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                   const float* __restrict__ mean, float* __restrict__ part, int* counter,
                   i64 M, int C, const float* __restrict__ invstd, const float* __restrict__ w,
                   float* __restrict__ dw, float* __restrict__ db, float* __restrict__ coef) {
  DNNCTL_DYN_SMEM(float, sw);  // [2][BLOCK][VEC]
  __shared__ int flag;
  constexpr int TXW = 128 / (VEC * (int)sizeof(elem_t)) > 0 ? 128 / (VEC * (int)sizeof(elem_t))
                                                            : 1;
  const int cvn = C / VEC;
  const int tx_n = min(cvn, TXW);
  const int rb = BLOCK / tx_n;
  const int tx = threadIdx.x % tx_n, ty = threadIdx.x / tx_n;
  const int cv = blockIdx.y * tx_n + tx;
  const bool live = ty < rb && cv < cvn;
  float m[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    m[i] = live ? mean[cv * VEC + i] : 0.f;
    s1[i] = s2[i] = 0.f;
  }
  if (live) {
    for (i64 r = (i64)blockIdx.x * rb + ty; r < M; r += (i64)gridDim.x * rb) {
      float g[VEC], v[VEC];
      load_vec<LD_NC, VEC>(dy + r * C + cv * VEC, g);
      load_vec<LD_NC, VEC>(x + r * C + cv * VEC, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        s1[i] += g[i];
        s2[i] += g[i] * (v[i] - m[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    sw[(0 * BLOCK + threadIdx.x) * VEC + i] = s1[i];
    sw[(1 * BLOCK + threadIdx.x) * VEC + i] = s2[i];
  }
  sync_block();
  if (ty == 0 && live) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      float a = 0.f, b = 0.f;
      for (int r = 0; r < rb; ++r) {
        a += sw[(0 * BLOCK + r * tx_n + tx) * VEC + i];
        b += sw[(1 * BLOCK + r * tx_n + tx) * VEC + i];
      }
      float* o = part + ((i64)blockIdx.x * C + cv * VEC + i) * 2;
      o[0] = a;
      o[1] = b;
    }
  }
  if (!last_block_of_tile(counter, blockIdx.y, gridDim.x, &flag)) return;
  constexpr int CT = TXW * VEC;  // channels of a full tile (the last tile may hold fewer)
  const int c0 = blockIdx.y * tx_n * VEC;
  fold_tile<BLOCK, CT>(part, gridDim.x, C, c0, sw);
  for (int j = threadIdx.x; j < tx_n * VEC && c0 + j < C; j += BLOCK)
    bn_bwd_finish(c0 + j, sw[j], sw[CT + j], (float)M, invstd, w, dw, db, coef);
}

// A grid-stride vector stream; the channel of vector k is (k * VEC / hw) % C (NCHW) or
// (k * VEC) % C (NHWC); a vector holds one channel (NCHW) or VEC channels (NHWC).
template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
          const float* __restrict__ mean, const float* __restrict__ coef,
          elem_t* __restrict__ dx, I nvec, int C, int hw) {
  for (I k = (I)blockIdx.x * BLOCK + threadIdx.x; k < nvec; k += (I)gridDim.x * BLOCK) {
    float g[VEC], v[VEC];
    load_vec<LD_NC, VEC>(dy + k * VEC, g);
    load_vec<LD_NC, VEC>(x + k * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int c = LAYOUT ? (int)((k * VEC + i) % C) : (int)((k * VEC / hw) % C);
      const float* q = coef + c * 3;
      g[i] = __ldg(q) * g[i] + __ldg(q + 1) * (v[i] - __ldg(mean + c)) + __ldg(q + 2);
    }
    store_vec<ST_PLAIN, VEC>(dx + k * VEC, g);
  }
}
