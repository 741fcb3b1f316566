// Softmax over rows walked as <dnnctl/rows.cuh> lays them out: the output of a vector
// (every kernel of kernels/softmax/*.cu but the backward) and the bodies of the kernels that
// keep a whole row on chip (warp_row, block_row, block_smem, async_smem), in registers or in
// shared memory: one global read, one global write.
#pragma once
#include <dnnctl/rows.cuh>
#include <dnnctl/softmax.cuh>

namespace dnnctl {

template <int VEC>
__device__ __forceinline__ void vec_max_into(float& m, const float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) m = fmaxf(m, f[i]);
}

// softmax_out of one vector (row max m, softmax_scale r), stored at dst.
template <int VEC>
__device__ __forceinline__ void softmax_store(elem_t* dst, float (&f)[VEC], float m, float r) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = softmax_out(f[i], m, r);
  store_vec<ST_PLAIN, VEC>(dst, f);
}

// Row `row` held in registers (for_row_vecs: NV vectors per thread, STRIDE threads a row),
// reduced by `red`; softmax keeps exp(x - max) in place between the sum and the output. A
// thread past the last row (live false) reads and writes nothing but takes part in every
// reduction.
template <int NV, int STRIDE, int VEC, typename R>
__device__ __forceinline__ void softmax_row_regs(const elem_t* __restrict__ x,
                                                 elem_t* __restrict__ y, i64 row, int cols,
                                                 int lane, bool live, const R& red) {
  const elem_t* xr = x + row * cols;
  float v[NV][VEC];
  float m = -DNNCTL_INF;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, live, [&](int j, int c) {
    load_vec<LD_NC, VEC>(xr + c, v[j]);
    vec_max_into(m, v[j]);
  });
  m = red.max(m);
  float s = 0.f;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, live, [&](int j, int) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float e = fast_exp(v[j][i] - m);
      s += e;
      if (!LOG) v[j][i] = e;
    }
  });
  s = red.sum(s);
  if (!live) return;  // only after every reduction
  const float r = softmax_scale(s);
  elem_t* yr = y + row * cols;
  for_row_vecs<NV, STRIDE, VEC>(lane, cols, true, [&](int j, int c) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[j][i] = LOG ? (v[j][i] - m) - r : v[j][i] * r;
    store_vec<ST_PLAIN, VEC>(yr + c, v[j]);
  });
}

// A row per block (blockIdx.x) kept in shared memory (cols * sizeof(elem_t) dynamic bytes;
// smem_row_fill: staged by cp.async when STAGED): max, sum and output from shared memory.
template <int BLOCK, int VEC, bool STAGED>
__device__ __forceinline__ void softmax_row_smem(const elem_t* __restrict__ x,
                                                 elem_t* __restrict__ y, int cols) {
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  const int nv = cols / VEC;
  float m = -DNNCTL_INF;
  smem_row_fill<BLOCK, VEC, STAGED>(buf, x + row * cols, nv,
                                    [&](int, auto& f) { vec_max_into(m, f); });
  m = block_max<BLOCK / 32>(m, red);
  float s = 0.f;
  row_pass<BLOCK, VEC, LD_PLAIN>(buf, nv, [&](int, auto& f) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += fast_exp(f[i] - m);
  });
  s = block_sum<BLOCK / 32>(s, red);
  const float r = softmax_scale(s);
  elem_t* yr = y + row * cols;
  row_pass<BLOCK, VEC, LD_PLAIN>(buf, nv,
                                 [&](int k, auto& f) { softmax_store(yr + k * VEC, f, m, r); });
}

}  // namespace dnnctl
