// Softmax, a row per block, single-pass online (max, sum) statistics, then a second read of
// the row to write the output (rows of any length; the re-read of a recent row mostly hits
// L2). Host: cols % VEC == 0 with VEC-aligned pointers (else it launches VEC = 1).
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_online(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  const int nv = cols / VEC;
  MaxSum a = maxsum_init();
  row_pass<BLOCK, VEC, LD_NC>(xr, nv, [&](int, auto& f) { maxsum_add_vec<VEC>(a, f); });
  const MaxSum t = block_maxsum<BLOCK / 32>(a, red);
  const float r = softmax_scale(t.s);
  elem_t* yr = y + row * cols;
  row_pass<BLOCK, VEC, LD_NC>(xr, nv,
                              [&](int k, auto& f) { softmax_store(yr + k * VEC, f, t.m, r); });
}
