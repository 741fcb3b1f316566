// Softmax, a row per TPR threads (a warp or an aligned part of one), the row in registers:
// one read, one write, reductions by shuffles. Thread `lane` holds vectors lane, lane + TPR,
// ... (NV of them), so a group's loads are contiguous. Host: cols <= NV * VEC * TPR and
// cols % VEC == 0 with VEC-aligned pointers (else it launches VEC = 1).
#include <dnnctl/softmax.cuh>

using namespace dnnctl;

template <int BLOCK, int TPR, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_warp(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  constexpr int RPB = BLOCK / TPR;
  const int lane = threadIdx.x % TPR;
  const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
  const bool live = row < rows;
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float m = -DNNCTL_INF;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + lane) * VEC;
    if (live && c < cols) {
      load_vec<LD_NC, VEC>(xr + c, v[j]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) m = fmaxf(m, v[j][i]);
    }
  }
  m = group_max<TPR>(m);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + lane) * VEC;
    if (live && c < cols) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float e = fast_exp(v[j][i] - m);
        s += e;
        if (!LOG) v[j][i] = e;
      }
    }
  }
  s = group_sum<TPR>(s);
  if (!live) return;  // only after every shuffle
  const float r = softmax_scale(s);
  elem_t* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + lane) * VEC;
    if (c < cols) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[j][i] = LOG ? (v[j][i] - m) - r : v[j][i] * r;
      store_vec<ST_PLAIN, VEC>(yr + c, v[j]);
    }
  }
}
