// Shared pieces of the row normalization kernels (layer_norm, rms_norm: kernels/norm/*.cu).
// Defines: DNNCTL_DTYPE, RMS (0: layer_norm, 1: rms_norm), HAS_W, HAS_B (0/1). Weight and bias
// are (cols,) in the I/O dtype. layer_norm: y = (x - mean) * rsqrt(var + eps) * w + b with the
// biased variance; rms_norm: y = x * rsqrt(mean(x^2) + eps) * w.
#pragma once
#include <dnnctl/rows.cuh>

#ifndef RMS
#define RMS 0
#endif
#ifndef HAS_W
#define HAS_W 1
#endif
#ifndef HAS_B
#define HAS_B 0
#endif

// The parameters of every forward entry (kernels/norm/{warp_row, block_row, block_smem,
// async_smem, welford}.cu), in the order the host passes them: x and y (rows x cols,
// row-major), weight and bias (cols,), eps.
#define NORM_ROW_PARAMS                                                 \
  const elem_t* __restrict__ x, const elem_t* __restrict__ w,          \
      const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols, float eps

namespace dnnctl {

// Normalize VEC elements of columns c .. c + VEC - 1 in place.
template <int VEC>
__device__ __forceinline__ void norm_apply(float (&f)[VEC], float mean, float rstd,
                                           const elem_t* __restrict__ w,
                                           const elem_t* __restrict__ b, int c) {
  float wv[VEC], bv[VEC];
  if (HAS_W) load_vec<LD_NC, VEC>(w + c, wv);
  if (HAS_B) load_vec<LD_NC, VEC>(b + c, bv);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    float t = (f[i] - mean) * rstd;
    if (HAS_W) t *= wv[i];
    if (HAS_B) t += bv[i];
    f[i] = t;
  }
}

// Normalize the vector of columns c .. c + VEC - 1 and store it at yr + c.
template <int VEC>
__device__ __forceinline__ void norm_store(elem_t* yr, int c, float (&f)[VEC], float mean,
                                           float rstd, const elem_t* __restrict__ w,
                                           const elem_t* __restrict__ b) {
  norm_apply<VEC>(f, mean, rstd, w, b, c);
  store_vec<ST_PLAIN, VEC>(yr + c, f);
}

// Fold the VEC values of one vector into a thread's row sum: of x (layer_norm) or of x^2
// (rms_norm).
template <int VEC>
__device__ __forceinline__ void norm_sum_add(float& s, const float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) s += RMS ? f[i] * f[i] : f[i];
}

// Fold the squared deviations from `mean` of one vector into a thread's sum.
template <int VEC>
__device__ __forceinline__ void norm_dev_add(float& q, const float (&f)[VEC], float mean) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) q += (f[i] - mean) * (f[i] - mean);
}

// Exact two-pass mean and (biased) variance of a row from each thread's norm_sum_add sum
// `s`: rms_norm needs nothing more (mean 0, var = mean(x^2)); layer_norm's variance is a
// second pass, `dev(mean)` returning the thread's norm_dev_add sum over the row it holds.
// Reductions by `red` (<dnnctl/rows.cuh>).
struct NormStats {
  float mean, var;
};

template <typename R, typename Dev>
__device__ __forceinline__ NormStats norm_stats(float s, int cols, const R& red, Dev&& dev) {
  s = red.sum(s);
  const float inv_n = 1.f / (float)cols;
  if (RMS) return NormStats{0.f, s * inv_n};
  const float mean = s * inv_n;
  return NormStats{mean, red.sum(dev(mean)) * inv_n};
}

// Row `row` held in registers (for_row_vecs: NV vectors per thread, STRIDE threads a row):
// one read, exact two-pass statistics from registers, one write. A thread past the last row
// (live false) reads and writes nothing but takes part in every reduction.
template <int NV, int STRIDE, int VEC, typename R>
__device__ __forceinline__ void norm_row_regs(const elem_t* __restrict__ x,
                                              const elem_t* __restrict__ w,
                                              const elem_t* __restrict__ b,
                                              elem_t* __restrict__ y, i64 row, int cols,
                                              float eps, int lane, bool live, const R& red) {
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float s = 0.f;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, live, [&](int j, int c) {
    load_vec<LD_NC, VEC>(xr + c, v[j]);
    norm_sum_add(s, v[j]);
  });
  const NormStats st = norm_stats(s, cols, red, [&](float m) {
    float q = 0.f;
    for_row_vecs<NV, STRIDE, VEC>(lane, cols, live, [&](int j, int) { norm_dev_add(q, v[j], m); });
    return q;
  });
  if (!live) return;  // only after every reduction
  const float rstd = rsqrtf(st.var + eps);
  elem_t* yr = y + row * cols;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, true, [&](int j, int c) {
    norm_store(yr, c, v[j], st.mean, rstd, w, b);
  });
}

// A row per block (blockIdx.x) kept in shared memory (cols * sizeof(elem_t) dynamic bytes;
// smem_row_fill: staged by cp.async when STAGED): one global read, exact two-pass statistics
// over shared memory, one global write.
template <int BLOCK, int VEC, bool STAGED>
__device__ __forceinline__ void norm_row_smem(const elem_t* __restrict__ x,
                                              const elem_t* __restrict__ w,
                                              const elem_t* __restrict__ b,
                                              elem_t* __restrict__ y, int cols, float eps) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  elem_t* yr = y + row * cols;
  const int nv = cols / VEC;
  float s = 0.f;
  smem_row_fill<BLOCK, VEC, STAGED>(buf, x + row * cols, nv,
                                    [&](int, auto& f) { norm_sum_add(s, f); });
  const NormStats st = norm_stats(s, cols, BlockReduce<BLOCK / 32>{red}, [&](float m) {
    float q = 0.f;
    row_pass<BLOCK, VEC, LD_PLAIN>(buf, nv, [&](int, auto& f) { norm_dev_add(q, f, m); });
    return q;
  });
  const float rstd = rsqrtf(st.var + eps);
  row_pass<BLOCK, VEC, LD_PLAIN>(buf, nv, [&](int k, auto& f) {
    norm_store(yr, k * VEC, f, st.mean, rstd, w, b);
  });
}

}  // namespace dnnctl
