// layer_norm / rms_norm backward over contiguous rows, statistics saved by the forward.
//   xhat = (x - mean) * rstd (rms: x * rstd), g = dy * w,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (rms: without mean(g))
//   dweight[c] = sum over rows of dy * xhat, dbias[c] = sum over rows of dy.
// norm_bwd_rows<BLOCK, TPR, VEC, NV, PART>: TPR threads per row (TPR <= 32: shuffles; TPR ==
//   BLOCK: a block per row), x and dy rows in registers. PART = 0: one row per group, dx only.
//   PART = 1: groups stride over rows and keep per-column dweight / dbias partials in registers,
//   written to part[(group * 2 + {0, 1}) * cols + c] at the end (a partial row per group).
// norm_bwd_cols<BLOCK>: the column pass: dweight / dbias partials of a split of the rows, a
//   column per lane (coalesced along the row), BLOCK / 32 row lanes folded in shared memory.
// norm_bwd_finish: sums the P partial rows per column in a fixed order (deterministic) and
//   writes dweight / dbias in the parameters' dtype.
// g = dy * w is rounded once (__fmul_rn, never contracted into an FMA) so the g in the sums
//   and the g of dx are one value: a row of length 1 (xhat = 0, mean(g) = g) gives dx = 0
//   exactly, as the formula does (an FMA-fused g - mean(g) left the product's rounding error).
// Defines: DNNCTL_DTYPE, RMS, HAS_W, HAS_B. Host: cols % VEC == 0, VEC-aligned pointers.
#include <dnnctl/chanreduce.cuh>
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

// The parameters of both row kernels (norm_bwd_rows, norm_bwd_stream), in the order the host
// passes them: dy, x, weight, the saved mean and rstd, dx, the dweight / dbias partials, the
// shape.
#define NORM_BWD_PARAMS                                                                      \
  const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ w, \
      const float* __restrict__ mean, const float* __restrict__ rstd, elem_t* __restrict__ dx, \
      float* __restrict__ part, int rows, int cols

// x and g = dy * w (rounded once) of the vector at columns c .. c + VEC - 1 of a row.
template <int VEC>
__device__ __forceinline__ void load_x_g(const elem_t* xr, const elem_t* gr,
                                         const elem_t* __restrict__ w, int c, float (&xv)[VEC],
                                         float (&g)[VEC]) {
  float wv[VEC];
  load_vec<LD_NC, VEC>(xr + c, xv);
  load_vec<LD_NC, VEC>(gr + c, g);
  if (HAS_W) load_vec<LD_NC, VEC>(w + c, wv);
#pragma unroll
  for (int i = 0; i < VEC; ++i) g[i] = HAS_W ? __fmul_rn(g[i], wv[i]) : g[i];
}

template <int BLOCK, int TPR>
__device__ __forceinline__ float row_sum(float v, float* red) {
  if (TPR <= 32) return group_sum<(TPR <= 32 ? TPR : 32)>(v);
  return block_sum<BLOCK / 32>(v, red);
}

template <int BLOCK, int TPR, int VEC, int NV, int PART>
__global__ void __launch_bounds__(BLOCK) norm_bwd_rows(NORM_BWD_PARAMS) {
  __shared__ float red[32];
  constexpr int RPB = BLOCK / TPR;
  const int lane = threadIdx.x % TPR;
  const int grp = threadIdx.x / TPR;
  const float inv_n = 1.f / (float)cols;
  float dwa[PART ? NV : 1][VEC], dba[PART ? NV : 1][VEC];
  if (PART) {
#pragma unroll
    for (int j = 0; j < (PART ? NV : 1); ++j)
#pragma unroll
      for (int i = 0; i < VEC; ++i) dwa[j][i] = dba[j][i] = 0.f;
  }
  const i64 step = PART ? (i64)gridDim.x * RPB : (i64)rows;
  for (i64 base = (i64)blockIdx.x * RPB; base < rows; base += step) {
    const i64 row = base + grp;
    const bool live = row < rows;
    float xv[NV][VEC], gv[NV][VEC];
    const float m = (!RMS && live) ? mean[row] : 0.f;
    const float rs = live ? rstd[row] : 0.f;
    float s1 = 0.f, s2 = 0.f;
    for_row_vecs<NV, TPR, VEC>(lane, cols, live, [&](int j, int c) {
      load_vec<LD_NC, VEC>(x + row * cols + c, xv[j]);
      load_vec<LD_NC, VEC>(dy + row * cols + c, gv[j]);
      float wv[VEC];
      if (HAS_W) load_vec<LD_NC, VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xh = (xv[j][i] - m) * rs;
        if (PART) {
          dwa[PART ? j : 0][i] += gv[j][i] * xh;
          dba[PART ? j : 0][i] += gv[j][i];
        }
        const float g = HAS_W ? __fmul_rn(gv[j][i], wv[i]) : gv[j][i];
        s1 += g;
        s2 += g * xh;
      }
    });
    s1 = row_sum<BLOCK, TPR>(s1, red) * inv_n;
    s2 = row_sum<BLOCK, TPR>(s2, red) * inv_n;
    if (!live) continue;  // (after the reductions: a block-wide one has barriers)
    for_row_vecs<NV, TPR, VEC>(lane, cols, true, [&](int j, int c) {
      float wv[VEC];
      if (HAS_W) load_vec<LD_NC, VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xh = (xv[j][i] - m) * rs;
        const float g = HAS_W ? __fmul_rn(gv[j][i], wv[i]) : gv[j][i];
        xv[j][i] = rs * (g - (RMS ? 0.f : s1) - xh * s2);
      }
      store_vec<ST_PLAIN, VEC>(dx + row * cols + c, xv[j]);
    });
  }
  if (PART) {
    float* pw = part + ((i64)(blockIdx.x * RPB + grp) * 2) * cols;
    for_row_vecs<(PART ? NV : 1), TPR, VEC>(lane, cols, true, [&](int j, int c) {
      store_vec<ST_PLAIN, VEC>(pw + c, dwa[j]);
      store_vec<ST_PLAIN, VEC>(pw + cols + c, dba[j]);
    });
  }
}

// grid (ceil(cols / 32), S); rows [split * per, (split + 1) * per).
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
norm_bwd_cols(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
              const float* __restrict__ mean, const float* __restrict__ rstd,
              float* __restrict__ part, int rows, int cols, int per) {
  __shared__ float2 sw[BLOCK];
  const ChannelTile t = channel_lanes<BLOCK>(cols, 32, blockIdx.x);  // a column per lane
  const int c = t.cv;
  const int begin = blockIdx.y * per, end = min(rows, begin + per);
  float2 s[1] = {make_float2(0.f, 0.f)};
  if (t.live) {
    for (int r = begin + t.ty; r < end; r += t.rb) {
      const float g = to_float(__ldg(dy + (i64)r * cols + c));
      const float xv = to_float(__ldg(x + (i64)r * cols + c));
      const float xh = (xv - (RMS ? 0.f : mean[r])) * rstd[r];
      s[0].x += g * xh;
      s[0].y += g;
    }
  }
  fold_row_lanes<BLOCK, 1>(sw, t, s, make_float2(0.f, 0.f), add_pair,
                           [&](const float2 (&total)[1]) {
                             part[((i64)blockIdx.y * 2) * cols + c] = total[0].x;
                             part[((i64)blockIdx.y * 2 + 1) * cols + c] = total[0].y;
                           });
}

// a thread per column: sum of P partial rows (part[(p * 2 + k) * cols + c]).
__global__ void __launch_bounds__(128)
norm_bwd_finish(const float* __restrict__ part, int P, int cols, elem_t* __restrict__ dw,
                elem_t* __restrict__ db) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= cols) return;
  float aw = 0.f, ab = 0.f;
  for (int p = 0; p < P; ++p) {
    aw += part[((i64)p * 2) * cols + c];
    ab += part[((i64)p * 2 + 1) * cols + c];
  }
  if (HAS_W) dw[c] = from_float<elem_t>(aw);
  if (HAS_B) db[c] = from_float<elem_t>(ab);
}

// Any length: a block per row, two reads of the row (the two sums, then dx); dweight / dbias
// come from norm_bwd_cols.
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) norm_bwd_stream(NORM_BWD_PARAMS) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const float m = RMS ? 0.f : mean[row];
  const float rs = rstd[row];
  const elem_t* xr = x + row * cols;
  const elem_t* gr = dy + row * cols;
  float s1 = 0.f, s2 = 0.f;
  for (int c = (int)threadIdx.x * VEC; c < cols; c += BLOCK * VEC) {
    float xv[VEC], g[VEC];
    load_x_g(xr, gr, w, c, xv, g);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      s1 += g[i];
      s2 += g[i] * (xv[i] - m) * rs;
    }
  }
  const float inv_n = 1.f / (float)cols;
  s1 = block_sum<BLOCK / 32>(s1, red) * inv_n;
  s2 = block_sum<BLOCK / 32>(s2, red) * inv_n;
  for (int c = (int)threadIdx.x * VEC; c < cols; c += BLOCK * VEC) {
    float xv[VEC], g[VEC];
    load_x_g(xr, gr, w, c, xv, g);
#pragma unroll
    for (int i = 0; i < VEC; ++i) xv[i] = rs * (g[i] - (RMS ? 0.f : s1) - (xv[i] - m) * rs * s2);
    store_vec<ST_PLAIN, VEC>(dx + row * cols + c, xv);
  }
}
