// layer_norm / rms_norm, a row per block, single-pass statistics (Welford per vector and
// Chan combines for layer_norm, a sum of squares for rms_norm), then a second read of the row
// to normalize (rows of any length). Host: cols % VEC == 0 with VEC-aligned pointers.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_welford(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
             const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols,
             float eps) {
  __shared__ float red[96];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  const int nv = cols / VEC;
  float mean = 0.f, var;
  if (RMS) {
    float s = 0.f;
    for (int k = threadIdx.x; k < nv; k += BLOCK) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xr + k * VEC, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += f[i] * f[i];
    }
    var = block_sum<BLOCK / 32>(s, red) / (float)cols;
  } else {
    Welford a = welford_init();
    for (int k = threadIdx.x; k < nv; k += BLOCK) {
      float f[VEC];
      load_vec<LD_NC, VEC>(xr + k * VEC, f);
      welford_add_vec<VEC>(a, f);
    }
    a = block_welford<BLOCK / 32>(a, red);
    mean = a.mean;
    var = a.m2 / (float)cols;
  }
  const float rstd = rsqrtf(var + eps);
  elem_t* yr = y + row * cols;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + k * VEC, f);
    norm_apply<VEC>(f, mean, rstd, w, b, k * VEC);
    store_vec<ST_PLAIN, VEC>(yr + k * VEC, f);
  }
}
