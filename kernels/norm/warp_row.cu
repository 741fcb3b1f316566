// layer_norm / rms_norm, a row per TPR threads (part of a warp), the row in registers: one
// read, exact two-pass mean and variance from registers, one write. Host: cols <= NV*VEC*TPR,
// cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). See <dnnctl/rownorm.cuh>.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int TPR, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
norm_warp(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
          const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols, float eps) {
  constexpr int RPB = BLOCK / TPR;
  const int lane = threadIdx.x % TPR;
  const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
  const bool live = row < rows;
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + lane) * VEC;
    if (live && c < cols) {
      load_vec<LD_NC, VEC>(xr + c, v[j]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += RMS ? v[j][i] * v[j][i] : v[j][i];
    }
  }
  s = group_sum<TPR>(s);
  const float inv_n = 1.f / (float)cols;
  float mean = 0.f, var = s * inv_n;
  if (!RMS) {
    mean = s * inv_n;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + lane) * VEC;
      if (live && c < cols) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) q += (v[j][i] - mean) * (v[j][i] - mean);
      }
    }
    var = group_sum<TPR>(q) * inv_n;
  }
  if (!live) return;  // only after every shuffle
  const float rstd = rsqrtf(var + eps);
  elem_t* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + lane) * VEC;
    if (c < cols) {
      norm_apply<VEC>(v[j], mean, rstd, w, b, c);
      store_vec<ST_PLAIN, VEC>(yr + c, v[j]);
    }
  }
}
