// batch_norm training forward, streaming form: statistics kernels with U loads in flight per
// thread (bn_train.cu's issue one per loop trip), bn_train.cu's bn_finalize<0> (a separate
// module), then the normalize pass as the exact-grid stream of <dnnctl/bn_exact.cuh> walking
// x from its end (REV = 1), so that the part of x the statistics pass read last, still in
// L2, is read first. Statistics as bn_train.cu's fused MODE 0: per-thread sums shifted by the
// thread's first value, turned into (n, mean, M2) and Chan-combined; one partial per
// (channel, split) in `part` (C x S x 3 floats).
// Defines: DNNCTL_DTYPE, AFFINE, PARAMS=1, LAYOUT, CH, HW.
#include <dnnctl/bn_exact.cuh>
#include <dnnctl/chanreduce.cuh>

// Shifted sums of n values: s1 = sum(v - k), s2 = sum((v - k)^2) with k the first value (no
// cancellation when |mean| >> std) -> (n, mean, M2) for Chan's combine.
__device__ __forceinline__ Welford shift_welford(float n, float k, float s1, float s2) {
  if (n == 0.f) return welford_init();
  const float d = s1 / n;
  return Welford{n, k + d, fmaxf(s2 - s1 * d, 0.f)};
}

// NCHW: grid (C, S). Work items are (n, part) pairs, P parts of `chunk` vectors per plane;
// each trip issues U vector loads BLOCK apart. Host: HW % VEC == 0, VEC-aligned x.
template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
bn_stats_planes_u(const elem_t* __restrict__ x, float* __restrict__ part, int N, int P,
                  int chunk) {
  __shared__ float red[96];
  const int c = blockIdx.x;
  constexpr int NV = HW / VEC;
  float cnt = 0.f, k = 0.f, s1 = 0.f, s2 = 0.f;
  for (i64 item = blockIdx.y; item < (i64)N * P; item += gridDim.y) {
    const int n = (int)(item / P), p = (int)(item % P);
    const int begin = p * chunk, end = min(NV, begin + chunk);
    const elem_t* xp = x + ((i64)n * CH + c) * HW;
    for (int k0 = begin + (int)threadIdx.x; k0 < end; k0 += BLOCK * U) {
      load_unrolled<U, VEC, LD_NC>(xp, VEC, k0, BLOCK, end, [&](int, auto& f) {
        if (cnt == 0.f) k = f[0];  // the shift: the first value this thread reads
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = f[i] - k;
          s1 += d;
          s2 += d * d;
        }
        cnt += (float)VEC;
      });
    }
  }
  const Welford t = block_welford<BLOCK / 32>(shift_welford(cnt, k, s1, s2), red);
  if (threadIdx.x == 0) welford_store(part + ((i64)c * gridDim.y + blockIdx.y) * 3, t);
}

// NHWC: x as M rows of CH channels; grid (S, channel tiles). A block is TX = min(CH/VEC,
// BLOCK) channel-vector lanes by RB = BLOCK / TX rows; each trip issues U grid-stride rows
// at once. The RB partials of a channel fold through shared memory (BLOCK * VEC * 3 floats,
// dynamic; <dnnctl/chanreduce.cuh>). Host: CH % VEC == 0, VEC-aligned x.
template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
bn_stats_rows_u(const elem_t* __restrict__ x, float* __restrict__ part, i64 M) {
  DNNCTL_DYN_SMEM(Welford, sw);  // [BLOCK][VEC]
  const ChannelTile t = channel_tile<BLOCK>(CH / VEC, BLOCK);
  float cnt = 0.f, k[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) k[i] = s1[i] = s2[i] = 0.f;
  if (t.live) {
    const i64 step = (i64)gridDim.x * t.rb;
    for (i64 r0 = (i64)blockIdx.x * t.rb + t.ty; r0 < M; r0 += step * U) {
      load_unrolled<U, VEC, LD_NC>(x + t.cv * VEC, (i64)CH, r0, step, M, [&](i64, auto& f) {
        if (cnt == 0.f) {  // the shift: the first row this thread reads
#pragma unroll
          for (int i = 0; i < VEC; ++i) k[i] = f[i];
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = f[i] - k[i];
          s1[i] += d;
          s2[i] += d * d;
        }
        cnt += 1.f;
      });
    }
  }
  Welford mine[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) mine[i] = shift_welford(cnt, k[i], s1[i], s2[i]);
  fold_row_welford<BLOCK, VEC>(sw, t, mine, part);
}
