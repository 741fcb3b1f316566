// batch_norm training forward: per-channel statistics over (N, H, W), then the normalize pass
// of <dnnctl/batchnorm.cuh> (compile with PARAMS=1: scale = weight * invstd from finalize).
//
// bn_stats_*<.., MODE> write one partial (count, mean, M2) per (channel, split) to `part`
// (C x S x 3 floats):
//   MODE 0  one fused pass: per-thread sums shifted by the thread's first value (no
//           cancellation when |mean| >> std), turned into (n, mean, M2) and Chan-combined;
//   MODE 1  first of two passes: plain sums -> (n, mean, 0);
//   MODE 2  second pass: sum of (x - mean[c])^2 with the mean of pass 1 -> (n, mean, M2).
// bn_finalize<STAGE> (a thread per channel) folds the S partials in a fixed order:
//   STAGE 1 writes the mean only (between the two passes); STAGE 0 / 2 write save_mean,
//   save_invstd, the running statistics (unbiased variance, momentum; the running arrays may
//   alias the new ones: each element is read, then written, by one thread) and scale.
// Defines: DNNCTL_DTYPE, AFFINE, PARAMS=1.
#include <dnnctl/batchnorm.cuh>
#include <dnnctl/chanreduce.cuh>

struct Acc {
  float k, s1, s2, n;
};

template <int MODE>
__device__ __forceinline__ void acc_add(Acc& a, float v, float mref) {
  if (MODE == 0) {
    if (a.n == 0.f) a.k = v;
    const float t = v - a.k;
    a.s1 += t;
    a.s2 += t * t;
  } else if (MODE == 1) {
    a.s1 += v;
  } else {
    const float t = v - mref;
    a.s2 += t * t;
  }
  a.n += 1.f;
}

template <int MODE>
__device__ __forceinline__ Welford acc_welford(const Acc& a, float mref) {
  if (a.n == 0.f) return welford_init();
  if (MODE == 0) {
    const float d = a.s1 / a.n;
    return Welford{a.n, a.k + d, fmaxf(a.s2 - a.s1 * d, 0.f)};
  }
  if (MODE == 1) return Welford{a.n, a.s1 / a.n, 0.f};
  return Welford{a.n, mref, a.s2};
}

// NCHW: grid (C, S). Work items are (n, part) pairs, P parts of `chunk` vectors per plane.
// Host: hw % VEC == 0 and VEC-aligned x (else VEC = 1).
template <int BLOCK, int VEC, int MODE>
__global__ void __launch_bounds__(BLOCK)
bn_stats_planes(const elem_t* __restrict__ x, float* __restrict__ part, const float* mean_in,
                int N, int C, int hw, int P, int chunk) {
  __shared__ float red[96];
  const int c = blockIdx.x;
  const float mref = MODE == 2 ? mean_in[c] : 0.f;
  const int nv = hw / VEC;
  Acc a{0.f, 0.f, 0.f, 0.f};
  for (i64 item = blockIdx.y; item < (i64)N * P; item += gridDim.y) {
    const int n = (int)(item / P), p = (int)(item % P);
    const int begin = p * chunk, end = min(nv, begin + chunk);
    const elem_t* xp = x + ((i64)n * C + c) * hw;
    for (int k = begin + (int)threadIdx.x; k < end; k += BLOCK) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xp + (i64)k * VEC, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc_add<MODE>(a, f[i], mref);
    }
  }
  const Welford t = block_welford<BLOCK / 32>(acc_welford<MODE>(a, mref), red);
  if (threadIdx.x == 0) welford_store(part + ((i64)c * gridDim.y + blockIdx.y) * 3, t);
}

// NHWC: x as M rows of C channels; grid (S, channel tiles). A block is TX = min(C/VEC, BLOCK)
// channel-vector lanes by RB = BLOCK / TX rows (<dnnctl/chanreduce.cuh>); the RB partials of a
// channel are folded through shared memory (BLOCK * VEC * 3 floats, dynamic). Host:
// C % VEC == 0, VEC-aligned x.
template <int BLOCK, int VEC, int MODE>
__global__ void __launch_bounds__(BLOCK)
bn_stats_rows(const elem_t* __restrict__ x, float* __restrict__ part, const float* mean_in,
              i64 M, int C) {
  DNNCTL_DYN_SMEM(Welford, sw);  // [BLOCK][VEC]
  const ChannelTile t = channel_tile<BLOCK>(C / VEC, BLOCK);
  float mref[VEC];
  Acc a[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    mref[i] = (MODE == 2 && t.live) ? mean_in[t.cv * VEC + i] : 0.f;
    a[i] = Acc{0.f, 0.f, 0.f, 0.f};
  }
  for_tile_rows(t, M, [&](i64 r) {
    float f[VEC];
    load_vec<LD_NC, VEC>(x + r * C + t.cv * VEC, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc_add<MODE>(a[i], f[i], mref[i]);
  });
  Welford mine[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) mine[i] = acc_welford<MODE>(a[i], mref[i]);
  fold_row_welford<BLOCK, VEC>(sw, t, mine, part);
}

template <int STAGE>
__global__ void __launch_bounds__(128)
bn_finalize(const float* __restrict__ part, int S, int C, const float* running_mean,
            const float* running_var, float* new_running_mean, float* new_running_var,
            float* __restrict__ save_mean, float* __restrict__ save_invstd,
            const float* __restrict__ w, float* __restrict__ ws_mean,
            float* __restrict__ ws_scale, float eps, float momentum) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= C) return;
  const Welford t = welford_fold(part + (i64)c * S * 3, S);
  if (STAGE == 1) {
    ws_mean[c] = t.mean;
    return;
  }
  const float mean = STAGE == 2 ? ws_mean[c] : t.mean;
  const float var = t.m2 / t.n;
  const float invstd = rsqrtf(var + eps);
  save_mean[c] = mean;
  save_invstd[c] = invstd;
  const float rm = running_mean[c], rv = running_var[c];
  new_running_mean[c] = (1.f - momentum) * rm + momentum * mean;
  new_running_var[c] = (1.f - momentum) * rv + momentum * (var * t.n / (t.n - 1.f));
  ws_scale[c] = AFFINE ? invstd * w[c] : invstd;
}
