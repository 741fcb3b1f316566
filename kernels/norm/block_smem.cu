// layer_norm / rms_norm, a row per block staged in shared memory (cols * sizeof(elem_t)
// dynamic bytes): one global read, exact two-pass statistics over shared memory, one global
// write. Each thread reads back only what it staged (no barrier needed for the staging).
// Host: cols % VEC == 0 with VEC-aligned pointers (else VEC = 1).
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_smem(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
          const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols, float eps) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  const int nv = cols / VEC;
  float s = 0.f;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + k * VEC, f);
    store_vec<ST_PLAIN, VEC>(buf + k * VEC, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += RMS ? f[i] * f[i] : f[i];
  }
  s = block_sum<BLOCK / 32>(s, red);
  const float inv_n = 1.f / (float)cols;
  float mean = 0.f, var = s * inv_n;
  if (!RMS) {
    mean = s * inv_n;
    float q = 0.f;
    for (int k = threadIdx.x; k < nv; k += BLOCK) {
      float f[VEC];
      load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) q += (f[i] - mean) * (f[i] - mean);
    }
    var = block_sum<BLOCK / 32>(q, red) * inv_n;
  }
  const float rstd = rsqrtf(var + eps);
  elem_t* yr = y + row * cols;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
    norm_apply<VEC>(f, mean, rstd, w, b, k * VEC);
    store_vec<ST_PLAIN, VEC>(yr + k * VEC, f);
  }
}
