// layer_norm / rms_norm, a row per block, single-pass statistics (Welford per vector and
// Chan combines for layer_norm, a sum of squares for rms_norm), then a second read of the row
// to normalize (rows of any length). Host: cols % VEC == 0 with VEC-aligned pointers.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) norm_welford(NORM_ROW_PARAMS) {
  __shared__ float red[96];
  const i64 row = blockIdx.x;
  const elem_t* xr = x + row * cols;
  const int nv = cols / VEC;
  float mean = 0.f, var;
  if (RMS) {
    float s = 0.f;
    row_pass<BLOCK, VEC, LD_NC>(xr, nv, [&](int, auto& f) { norm_sum_add(s, f); });
    var = block_sum<BLOCK / 32>(s, red) / (float)cols;
  } else {
    Welford a = welford_init();
    row_pass<BLOCK, VEC, LD_NC>(xr, nv, [&](int, auto& f) { welford_add_vec<VEC>(a, f); });
    a = block_welford<BLOCK / 32>(a, red);
    mean = a.mean;
    var = a.m2 / (float)cols;
  }
  const float rstd = rsqrtf(var + eps);
  elem_t* yr = y + row * cols;
  row_pass<BLOCK, VEC, LD_NC>(xr, nv, [&](int k, auto& f) {
    norm_store(yr, k * VEC, f, mean, rstd, w, b);
  });
}
