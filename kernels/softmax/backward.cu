// softmax / log_softmax backward over contiguous rows:
//   softmax      dx = y * (dy - sum(dy * y))
//   log_softmax  dx = dy - exp(y) * sum(dy)
// One read of y and dy, one write of dx; the row's dot product is the only reduction.
// softmax_bwd_warp: TPR threads (part of a warp) per row, both rows in registers (shuffles
// only). softmax_bwd_block: a block per row, both rows in registers (block reduction).
// Host: cols % VEC == 0 and VEC-aligned pointers (else VEC = 1).
// Defines: DNNCTL_DTYPE, LOG.
#include <dnnctl/rows.cuh>

#ifndef LOG
#define LOG 0
#endif

using namespace dnnctl;

__device__ __forceinline__ float sm_bwd_term(float y, float g) { return LOG ? g : g * y; }

__device__ __forceinline__ float sm_bwd_out(float y, float g, float s) {
  return LOG ? g - fast_exp(y) * s : y * (g - s);
}

// Row `row` of y and dy in registers (for_row_vecs: NV vectors per thread, STRIDE threads a
// row), the dot product reduced by `red`. A thread past the last row (live false) reads and
// writes nothing but takes part in the reduction.
template <int NV, int STRIDE, int VEC, typename R>
__device__ __forceinline__ void softmax_bwd_regs(const elem_t* __restrict__ y,
                                                 const elem_t* __restrict__ dy,
                                                 elem_t* __restrict__ dx, i64 row, int cols,
                                                 int lane, bool live, const R& red) {
  float yv[NV][VEC], gv[NV][VEC];
  float s = 0.f;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, live, [&](int j, int c) {
    load_vec<LD_NC, VEC>(y + row * cols + c, yv[j]);
    load_vec<LD_NC, VEC>(dy + row * cols + c, gv[j]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += sm_bwd_term(yv[j][i], gv[j][i]);
  });
  s = red.sum(s);
  if (!live) return;  // only after every reduction
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, true, [&](int j, int c) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) yv[j][i] = sm_bwd_out(yv[j][i], gv[j][i], s);
    store_vec<ST_PLAIN, VEC>(dx + row * cols + c, yv[j]);
  });
}

template <int BLOCK, int TPR, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_bwd_warp(const elem_t* __restrict__ y, const elem_t* __restrict__ dy,
                 elem_t* __restrict__ dx, int rows, int cols) {
  constexpr int RPB = BLOCK / TPR;
  const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
  softmax_bwd_regs<NV, TPR, VEC>(y, dy, dx, row, cols, threadIdx.x % TPR, row < rows,
                                 GroupReduce<TPR>{});
}

template <int BLOCK, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_bwd_block(const elem_t* __restrict__ y, const elem_t* __restrict__ dy,
                  elem_t* __restrict__ dx, int rows, int cols) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  softmax_bwd_regs<NV, BLOCK, VEC>(y, dy, dx, row, cols, threadIdx.x, true,
                                   BlockReduce<BLOCK / 32>{red});
}

// Any length: a block per row, two reads (dot product, then the output).
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_bwd_stream(const elem_t* __restrict__ y, const elem_t* __restrict__ dy,
                   elem_t* __restrict__ dx, int rows, int cols) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const elem_t* yr = y + row * cols;
  const elem_t* gr = dy + row * cols;
  float s = 0.f;
  for (int c = (int)threadIdx.x * VEC; c < cols; c += BLOCK * VEC) {
    float a[VEC], b[VEC];
    load_vec<LD_NC, VEC>(yr + c, a);
    load_vec<LD_NC, VEC>(gr + c, b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += sm_bwd_term(a[i], b[i]);
  }
  s = block_sum<BLOCK / 32>(s, red);
  for (int c = (int)threadIdx.x * VEC; c < cols; c += BLOCK * VEC) {
    float a[VEC], b[VEC];
    load_vec<LD_NC, VEC>(yr + c, a);
    load_vec<LD_NC, VEC>(gr + c, b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = sm_bwd_out(a[i], b[i], s);
    store_vec<ST_PLAIN, VEC>(dx + row * cols + c, a);
  }
}
