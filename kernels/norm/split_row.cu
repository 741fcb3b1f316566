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
  const int begin = blockIdx.x * chunk;
  const int end = min(cols, begin + chunk);
  const elem_t* xr = x + row * cols;
  Welford a = welford_init();
  float ss = 0.f;
  for (int c = begin + (int)threadIdx.x * VEC; c < end; c += BLOCK * VEC) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + c, f);
    if (RMS) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss += f[i] * f[i];
      a.n += (float)VEC;
    } else {
      welford_add_vec<VEC>(a, f);
    }
  }
  if (RMS) a.m2 = ss;  // mean stays 0: Chan's combine then adds the sums of squares
  a = block_welford<BLOCK / 32>(a, red);
  if (threadIdx.x == 0) {
    float* o = part + (row * gridDim.x + blockIdx.x) * 3;
    o[0] = a.n;
    o[1] = a.mean;
    o[2] = a.m2;
  }
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
norm_split_apply(const elem_t* __restrict__ x, const float* __restrict__ part,
                 const elem_t* __restrict__ w, const elem_t* __restrict__ b,
                 elem_t* __restrict__ y, int rows, int cols, int chunk, float eps) {
  const i64 row = blockIdx.y;
  Welford t = welford_init();
  for (int i = 0; i < (int)gridDim.x; ++i) {
    const float* p = part + (row * gridDim.x + i) * 3;
    t = welford_combine(t, Welford{p[0], p[1], p[2]});
  }
  const float mean = RMS ? 0.f : t.mean;
  const float rstd = rsqrtf(t.m2 / (float)cols + eps);
  const int begin = blockIdx.x * chunk;
  const int end = min(cols, begin + chunk);
  const elem_t* xr = x + row * cols;
  elem_t* yr = y + row * cols;
  for (int c = begin + (int)threadIdx.x * VEC; c < end; c += BLOCK * VEC) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + c, f);
    norm_apply<VEC>(f, mean, rstd, w, b, c);
    store_vec<ST_PLAIN, VEC>(yr + c, f);
  }
}
