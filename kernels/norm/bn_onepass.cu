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
#include <dnnctl/lastblock.cuh>

// The statistics of channel c from the sums of (x - k) over `count` values.
__device__ __forceinline__ void bnt_finish(int c, float k, float s1, float s2, float count,
                                           const float* running_mean, const float* running_var,
                                           float* new_running_mean, float* new_running_var,
                                           float* save_mean, float* save_invstd,
                                           const float* w, float* scale, float eps,
                                           float momentum) {
  const float d = s1 / count;
  const float mean = k + d;
  const float var = fmaxf(s2 / count - d * d, 0.f);
  const float invstd = rsqrtf(var + eps);
  save_mean[c] = mean;
  save_invstd[c] = invstd;
  const float rm = running_mean[c], rv = running_var[c];
  new_running_mean[c] = (1.f - momentum) * rm + momentum * mean;
  new_running_var[c] = (1.f - momentum) * rv + momentum * (var * count / (count - 1.f));
  scale[c] = AFFINE ? invstd * w[c] : invstd;
}

// NHWC: x as M rows of CH channels; grid (S, tiles). A tile is 128 bytes of a row: TX =
// min(CH / VEC, 128 / (VEC * sizeof(elem_t))) channel-vector lanes by RB = BLOCK / TX rows (a
// warp still reads whole 128-byte lines), so that a tile's last block folds few channels of
// few partials; a trip loads U rows gridDim.x * RB apart. Partials are split-major
// (part[(s * CH + c) * 2 + {0, 1}]): the fold reads them coalesced. Dynamic shared memory:
// 2 * BLOCK * VEC floats.
template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
bnt_stats_rows(const elem_t* __restrict__ x, float* __restrict__ part, int* counter, i64 M,
               const float* running_mean, const float* running_var, float* new_running_mean,
               float* new_running_var, float* __restrict__ save_mean,
               float* __restrict__ save_invstd, const float* __restrict__ w,
               float* __restrict__ scale, float eps, float momentum) {
  DNNCTL_DYN_SMEM(float, sw);  // [2][BLOCK][VEC]
  __shared__ int flag;
  constexpr int CVN = CH / VEC;
  constexpr int TXW = 128 / (VEC * (int)sizeof(elem_t)) > 0 ? 128 / (VEC * (int)sizeof(elem_t))
                                                            : 1;
  constexpr int TX = CVN < TXW ? CVN : TXW;
  constexpr int RB = BLOCK / TX;
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const int cv = blockIdx.y * TX + tx;
  const bool live = ty < RB && cv < CVN;
  float k[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) s1[i] = s2[i] = 0.f;
  if (live) load_vec<LD_NC, VEC>(x + cv * VEC, k);
  const i64 stride = (i64)gridDim.x * RB;
  if (live) {
    for (i64 r0 = (i64)blockIdx.x * RB + ty; r0 < M; r0 += stride * U) {
      float f[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r0 + u * stride < M)
          load_vec<LD_NC, VEC>(x + (r0 + u * stride) * CH + cv * VEC, f[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r0 + u * stride < M) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float t = f[u][i] - k[i];
            s1[i] += t;
            s2[i] += t * t;
          }
        }
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
      for (int r = 0; r < RB; ++r) {
        a += sw[(0 * BLOCK + r * TX + tx) * VEC + i];
        b += sw[(1 * BLOCK + r * TX + tx) * VEC + i];
      }
      float* o = part + ((i64)blockIdx.x * CH + cv * VEC + i) * 2;
      o[0] = a;
      o[1] = b;
    }
  }
  if (!last_block_of_tile(counter, blockIdx.y, gridDim.x, &flag)) return;
  constexpr int CT = TX * VEC;
  const int c0 = blockIdx.y * CT;
  fold_tile<BLOCK, CT>(part, gridDim.x, CH, c0, sw);  // (sw: 2 * BLOCK * VEC floats)
  for (int j = threadIdx.x; j < CT && c0 + j < CH; j += BLOCK)
    bnt_finish(c0 + j, to_float(x[c0 + j]), sw[j], sw[CT + j], (float)M, running_mean,
               running_var, new_running_mean, new_running_var, save_mean, save_invstd, w,
               scale, eps, momentum);
}

// NCHW: grid (C, S); a block walks vectors k = s * BLOCK + t (U at once, gridDim.y * BLOCK
// apart) of the channel's N planes (N * HW / VEC vectors).
template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
bnt_stats_planes(const elem_t* __restrict__ x, float* __restrict__ part, int* counter, int N,
                 const float* running_mean, const float* running_var, float* new_running_mean,
                 float* new_running_var, float* __restrict__ save_mean,
                 float* __restrict__ save_invstd, const float* __restrict__ w,
                 float* __restrict__ scale, float eps, float momentum) {
  __shared__ float red[32];
  __shared__ int flag;
  constexpr int NV = HW / VEC;
  const int c = blockIdx.x;
  const float k = to_float(x[(i64)c * HW]);
  const i64 total = (i64)N * NV;
  const i64 stride = (i64)gridDim.y * BLOCK;
  float s1 = 0.f, s2 = 0.f;
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
          const float t = f[u][i] - k;
          s1 += t;
          s2 += t * t;
        }
      }
    }
  }
  s1 = block_sum<BLOCK / 32>(s1, red);
  s2 = block_sum<BLOCK / 32>(s2, red);
  if (threadIdx.x == 0) {
    part[((i64)blockIdx.y * CH + c) * 2] = s1;
    part[((i64)blockIdx.y * CH + c) * 2 + 1] = s2;
  }
  if (!last_block_of_tile(counter, c, gridDim.y, &flag)) return;
  float a = 0.f, b = 0.f;
  for (int s = threadIdx.x; s < (int)gridDim.y; s += BLOCK) {
    a += __ldcg(part + ((i64)s * CH + c) * 2);
    b += __ldcg(part + ((i64)s * CH + c) * 2 + 1);
  }
  a = block_sum<BLOCK / 32>(a, red);
  b = block_sum<BLOCK / 32>(b, red);
  if (threadIdx.x == 0) {
    bnt_finish(c, k, a, b, (float)total * VEC, running_mean, running_var, new_running_mean,
               new_running_var, save_mean, save_invstd, w, scale, eps, momentum);
  }
}
