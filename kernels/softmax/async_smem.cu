// Softmax, a row per block staged in shared memory by cp.async (cols * sizeof(elem_t)
// dynamic bytes): all of a thread's copies are in flight at once (block_smem issues one load
// per loop trip), then max, sum and output from shared memory: one global read, one global
// write. Each thread reads back only the vectors it copied, so its own cp.async wait is the
// only synchronization the staging needs. Host: cols % VEC == 0 with VEC-aligned pointers
// (else VEC = 1).
#include <dnnctl/softmax.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_async(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  const int nv = cols / VEC;
  stage_row<BLOCK, VEC>(buf, xr, nv);
  float m = -DNNCTL_INF;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = fmaxf(m, f[i]);
  }
  m = block_max<BLOCK / 32>(m, red);
  float s = 0.f;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += fast_exp(f[i] - m);
  }
  s = block_sum<BLOCK / 32>(s, red);
  const float r = softmax_scale(s);
  elem_t* yr = y + row * cols;
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = softmax_out(f[i], m, r);
    store_vec<ST_PLAIN, VEC>(yr + k * VEC, f);
  }
}
