// group_norm backward with the forward's per-(sample, group) mean / rstd (fp32 (N, G)):
//   xhat = (x - mean) * rstd, g = dy * w[c]; over the M = C/G * H * W elements of a group
//   dx = rstd * (g - sum(g) / M - xhat * sum(g * xhat) / M)
//      = A[n, c] dy + B[n, g] (x - mean[n, g]) + C0[n, g]  (x - mean per element: folding
//        B mean into C0 would cancel B x against it and lose the bits of mean / std)
//   dweight[c] = sum over (n, h, w) of dy * xhat, dbias[c] = sum of dy.
// gn_bwd_planes (NCHW: a block per (c, n) plane) / gn_bwd_pixels (NHWC: 32 channel lanes by
//   BLOCK / 32 pixel lanes) write per-(n, c) sums (sum dy, sum dy * (x - mean)) to
//   part[(n * C + c) * 2 + {0, 1}];
// gn_bwd_coef: a thread per (n, g) folds its channels into (B, C0);
// gn_bwd_params: a thread per channel folds the samples into dweight / dbias (fixed order);
// gn_bwd_dx: a vector stream over dy and x (x and dy are read twice in all).
// Defines: DNNCTL_DTYPE, AFFINE, LAYOUT (0 NCHW, 1 NHWC), GROUPS.
#include <dnnctl/chanreduce.cuh>
#include <dnnctl/groupnorm.cuh>  // (its defaults of AFFINE and LAYOUT)

using namespace dnnctl;

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
gn_bwd_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
              const float* __restrict__ mean, float* __restrict__ part, int C, int hw) {
  __shared__ float red[32];
  const int c = blockIdx.x, n = blockIdx.y;
  const float m = mean[n * GROUPS + c / (C / GROUPS)];
  const i64 base = ((i64)n * C + c) * hw;
  float a = 0.f, b = 0.f;
  for (int k = threadIdx.x; k < hw; k += BLOCK) {
    const float g = to_float(__ldg(dy + base + k));
    a += g;
    b += g * (to_float(__ldg(x + base + k)) - m);
  }
  a = block_sum<BLOCK / 32>(a, red);
  b = block_sum<BLOCK / 32>(b, red);
  if (threadIdx.x == 0) {
    part[((i64)n * C + c) * 2] = a;
    part[((i64)n * C + c) * 2 + 1] = b;
  }
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
gn_bwd_pixels(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
              const float* __restrict__ mean, float* __restrict__ part, int C, int hw) {
  __shared__ float2 sw[BLOCK];
  const ChannelTile t = channel_lanes<BLOCK>(C, 32, blockIdx.x);  // a channel per lane
  const int c = t.cv, n = blockIdx.y;
  float2 s[1] = {make_float2(0.f, 0.f)};
  if (t.live) {
    const float m = mean[n * GROUPS + c / (C / GROUPS)];
    const i64 base = (i64)n * hw * C + c;
    for (int p = t.ty; p < hw; p += t.rb) {
      const float g = to_float(__ldg(dy + base + (i64)p * C));
      s[0].x += g;
      s[0].y += g * (to_float(__ldg(x + base + (i64)p * C)) - m);
    }
  }
  fold_row_lanes<BLOCK, 1>(sw, t, s, make_float2(0.f, 0.f), add_pair,
                           [&](const float2 (&total)[1]) {
                             part[((i64)n * C + c) * 2] = total[0].x;
                             part[((i64)n * C + c) * 2 + 1] = total[0].y;
                           });
}

__global__ void __launch_bounds__(128)
gn_bwd_coef(const float* __restrict__ part, const float* __restrict__ rstd, const float* __restrict__ w,
            float* __restrict__ coef, int N, int C, float count) {
  const int t = blockIdx.x * 128 + threadIdx.x;
  if (t >= N * GROUPS) return;
  const int n = t / GROUPS, g = t % GROUPS, cpg = C / GROUPS;
  const float rs = rstd[t];
  float s1 = 0.f, s2 = 0.f;
  for (int c = g * cpg; c < (g + 1) * cpg; ++c) {
    const float wc = AFFINE ? w[c] : 1.f;
    s1 += wc * part[((i64)n * C + c) * 2];
    s2 += wc * part[((i64)n * C + c) * 2 + 1] * rs;  // sum g * xhat
  }
  const float b = -rs * rs * s2 / count;
  coef[t * 2] = b;
  coef[t * 2 + 1] = -rs * s1 / count;
}

__global__ void __launch_bounds__(128)
gn_bwd_params(const float* __restrict__ part, const float* __restrict__ rstd,
              float* __restrict__ dw, float* __restrict__ db, int N, int C) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= C) return;
  const int g = c / (C / GROUPS);
  float a = 0.f, b = 0.f;
  for (int n = 0; n < N; ++n) {
    a += part[((i64)n * C + c) * 2];
    b += part[((i64)n * C + c) * 2 + 1] * rstd[n * GROUPS + g];
  }
  dw[c] = b;
  db[c] = a;
}

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
gn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
          const float* __restrict__ w, const float* __restrict__ mean,
          const float* __restrict__ rstd, const float* __restrict__ coef,
          elem_t* __restrict__ dx, I nvec, int C, int hw) {
  const int cpg = C / GROUPS;
  stream_pairs<BLOCK, VEC>(dy, x, nvec, [&](I k, float (&g)[VEC], const float (&v)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const I e = k * VEC + i;
      const int c = LAYOUT ? (int)(e % C) : (int)((e / hw) % C);
      const int n = (int)(e / ((I)hw * C));
      const int t = n * GROUPS + c / cpg;
      const float a = __ldg(rstd + t) * (AFFINE ? __ldg(w + c) : 1.f);
      g[i] = a * g[i] + __ldg(coef + 2 * t) * (v[i] - __ldg(mean + t)) +
             __ldg(coef + 2 * t + 1);
    }
    store_vec<ST_PLAIN, VEC>(dx + k * VEC, g);
  });
}
