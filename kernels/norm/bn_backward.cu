// batch_norm training backward with the forward's saved mean / invstd (fp32 (C,)):
//   xhat = (x - mean) * invstd, dweight = sum(dy * xhat), dbias = sum(dy) over (N, H, W),
//   dx = w * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M)  =  a dy + b x + c0.
// bn_bwd_reduce_{planes,rows}: partial (sum dy, sum dy * (x - mean)) per (channel, split) in
//   part[(c * S + s) * 2 + {0, 1}]; bn_bwd_finalize: a thread per channel folds the S partials
//   in a fixed order, writes dweight / dbias and the coefficients (a, b, c0) of dx;
//   bn_bwd_dx: a vector stream over dy and x writing dx (reads dy and x a second time).
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT (0 NCHW, 1 NHWC). Host: the channel's inner extent
// (hw for NCHW, C for NHWC) % VEC == 0 and VEC-aligned x / dy / dx (else VEC = 1).
#include <dnnctl/memory.cuh>

#ifndef AFFINE
#define AFFINE 1
#endif
#ifndef LAYOUT
#define LAYOUT 0
#endif

using namespace dnnctl;

// NCHW: grid (C, S); a block walks vectors k = s*BLOCK + t, stride S*BLOCK, of the channel's
// N planes (N * hw / VEC vectors).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                     const float* __restrict__ mean, float* __restrict__ part, int N, int C,
                     int hw) {
  __shared__ float red[32];
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
    part[((i64)c * gridDim.y + blockIdx.y) * 2] = s1;
    part[((i64)c * gridDim.y + blockIdx.y) * 2 + 1] = s2;
  }
}

// NHWC: x as M rows of C; grid (S, channel tiles); TX = min(C / VEC, BLOCK) channel-vector
// lanes by RB = BLOCK / TX rows, folded through shared memory (2 * BLOCK * VEC floats).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_reduce_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                   const float* __restrict__ mean, float* __restrict__ part, i64 M, int C) {
  DNNCTL_DYN_SMEM(float, sw);  // [2][BLOCK][VEC]
  const int cvn = C / VEC;
  const int tx_n = min(cvn, BLOCK);
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
  if (ty != 0 || !live) return;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    float a = 0.f, b = 0.f;
    for (int r = 0; r < rb; ++r) {
      const int j = r * tx_n + tx;
      a += sw[(0 * BLOCK + j) * VEC + i];
      b += sw[(1 * BLOCK + j) * VEC + i];
    }
    float* o = part + ((i64)(cv * VEC + i) * gridDim.x + blockIdx.x) * 2;
    o[0] = a;
    o[1] = b;
  }
}

__global__ void __launch_bounds__(128)
bn_bwd_finalize(const float* __restrict__ part, int S, int C, float count,
                const float* __restrict__ mean, const float* __restrict__ invstd,
                const float* __restrict__ w, float* __restrict__ dw, float* __restrict__ db,
                float* __restrict__ coef) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= C) return;
  float s1 = 0.f, s2 = 0.f;
  for (int s = 0; s < S; ++s) {
    s1 += part[((i64)c * S + s) * 2];
    s2 += part[((i64)c * S + s) * 2 + 1];
  }
  const float is = invstd[c];
  if (AFFINE) {
    dw[c] = s2 * is;
    db[c] = s1;
  }
  const float a = AFFINE ? w[c] * is : is;
  const float b = -a * is * is * s2 / count;
  coef[c * 3] = a;
  coef[c * 3 + 1] = b;
  coef[c * 3 + 2] = -a * s1 / count - b * mean[c];
}

// A grid-stride vector stream; the channel of vector k is (k * VEC / hw) % C (NCHW) or
// (k * VEC) % C (NHWC); a vector holds one channel (NCHW) or VEC channels (NHWC).
template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
bn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
          const float* __restrict__ coef, elem_t* __restrict__ dx, I nvec, int C, int hw) {
  for (I k = (I)blockIdx.x * BLOCK + threadIdx.x; k < nvec; k += (I)gridDim.x * BLOCK) {
    float g[VEC], v[VEC];
    load_vec<LD_NC, VEC>(dy + k * VEC, g);
    load_vec<LD_NC, VEC>(x + k * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int c = LAYOUT ? (int)((k * VEC + i) % C) : (int)((k * VEC / hw) % C);
      const float* q = coef + c * 3;
      g[i] = __ldg(q) * g[i] + __ldg(q + 1) * v[i] + __ldg(q + 2);
    }
    store_vec<ST_PLAIN, VEC>(dx + k * VEC, g);
  }
}
