// Softmax, a row per block, the row in registers (NV vectors of VEC per thread): one read,
// one write, block reductions through shared memory. Host: cols <= NV * VEC * BLOCK and
// cols % VEC == 0 with VEC-aligned pointers (else it launches VEC = 1).
#include <dnnctl/softmax.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_block(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float m = -DNNCTL_INF;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
    if (c < cols) {
      load_vec<LD_NC, VEC>(xr + c, v[j]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) m = fmaxf(m, v[j][i]);
    }
  }
  m = block_max<BLOCK / 32>(m, red);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
    if (c < cols) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float e = fast_exp(v[j][i] - m);
        s += e;
        if (!LOG) v[j][i] = e;
      }
    }
  }
  s = block_sum<BLOCK / 32>(s, red);
  const float r = softmax_scale(s);
  elem_t* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * BLOCK + (int)threadIdx.x) * VEC;
    if (c < cols) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[j][i] = LOG ? (v[j][i] - m) - r : v[j][i] * r;
      store_vec<ST_PLAIN, VEC>(yr + c, v[j]);
    }
  }
}
