// layer_norm / rms_norm, a row per block staged in shared memory by cp.async
// (cols * sizeof(elem_t) dynamic bytes): all of a thread's copies are in flight at once
// (block_smem issues one load per loop trip), then exact two-pass statistics and the output
// from shared memory: one global read, one global write. Each thread reads back only the
// vectors it copied (its own cp.async wait is the only synchronization the staging needs).
// Host: cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). See <dnnctl/rownorm.cuh>.
#include <dnnctl/rownorm.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_async(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
           const elem_t* __restrict__ b, elem_t* __restrict__ y, int rows, int cols,
           float eps) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const int nv = cols / VEC;
  stage_row<BLOCK, VEC>(buf, x + row * cols, nv);
  float s = 0.f;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
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
