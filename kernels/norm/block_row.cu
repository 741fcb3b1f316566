// layer_norm / rms_norm, a row per block, the row in registers (NV vectors of VEC per
// thread): one read, exact two-pass statistics from registers, one write. Host:
// cols <= NV*VEC*BLOCK, cols % VEC == 0 with VEC-aligned pointers (else VEC = 1).
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
norm_block(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
           const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols, float eps) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
    if (c < cols) {
      load_vec<LD_NC, VEC>(xr + c, v[j]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += RMS ? v[j][i] * v[j][i] : v[j][i];
    }
  }
  s = block_sum<BLOCK / 32>(s, red);
  const float inv_n = 1.f / (float)cols;
  float mean = 0.f, var = s * inv_n;
  if (!RMS) {
    mean = s * inv_n;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
      if (c < cols) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) q += (v[j][i] - mean) * (v[j][i] - mean);
      }
    }
    var = block_sum<BLOCK / 32>(q, red) * inv_n;
  }
  const float rstd = rsqrtf(var + eps);
  elem_t* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
    if (c < cols) {
      norm_apply<VEC>(v[j], mean, rstd, w, b, c);
      store_vec<ST_PLAIN, VEC>(yr + c, v[j]);
    }
  }
}
