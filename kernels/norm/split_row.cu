// layer_norm / rms_norm for few, very long rows: each row is split into chunks of `chunk`
// elements on separate blocks (grid: splits x rows). norm_split_stats writes each chunk's
// Welford partial (n, mean, M2) — rms_norm: (n, 0, sum of squares) — to `part` (rows x splits
// x 3 floats); norm_split_apply folds a row's partials in a fixed order (every block of a row
// gets identical statistics) and normalizes its chunk, read moments ago (mostly from L2).
// Host: chunk % VEC == 0, cols % VEC == 0 with VEC-aligned pointers (else VEC = 1),
// rows <= 65535. See <dnnctl/rownorm.cuh>.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_split_stats(const elem_t* __restrict__ x, float* __restrict__ part, int rows, int cols,
                 int chunk) {
  __shared__ float red[96];
  const i64 row = blockIdx.y;
  Welford a = welford_init();
  float ss = 0.f;
  chunk_pass<BLOCK, VEC>(x + row * cols, cols, chunk, [&](int, auto& f) {
    if (RMS) {
      norm_sum_add(ss, f);
      a.n += (float)VEC;
    } else {
      welford_add_vec<VEC>(a, f);
    }
  });
  if (RMS) a.m2 = ss;  // mean stays 0: Chan's combine then adds the sums of squares
  a = block_welford<BLOCK / 32>(a, red);
  if (threadIdx.x == 0) welford_store(part + (row * gridDim.x + blockIdx.x) * 3, a);
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_split_apply(const elem_t* __restrict__ x, const float* __restrict__ part,
                 const elem_t* __restrict__ w, const elem_t* __restrict__ b,
                 elem_t* __restrict__ y, int rows, int cols, int chunk, float eps) {
  const i64 row = blockIdx.y;
  const Welford t = welford_fold(part + row * gridDim.x * 3, gridDim.x);
  const float mean = RMS ? 0.f : t.mean;
  const float rstd = rsqrtf(t.m2 / (float)cols + eps);
  elem_t* yr = y + row * cols;
  chunk_pass<BLOCK, VEC>(x + row * cols, cols, chunk,
                         [&](int c, auto& f) { norm_store(yr, c, f, mean, rstd, w, b); });
}
