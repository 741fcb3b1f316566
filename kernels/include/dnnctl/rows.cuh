// How the row kernels (softmax, layer_norm / rms_norm: kernels/softmax, kernels/norm) walk a
// row of `cols` elements in vectors of VEC, and reduce over the threads that share it. The
// op-specific arithmetic (<dnnctl/softmax_row.cuh>, <dnnctl/rownorm.cuh>) is written once on
// top of these and instantiated by each kernel's layout:
//   * registers: a row per STRIDE threads (a block, or TPR lanes of a warp), NV vectors each;
//   * shared memory: a row per block, staged once (global read) and read back per pass.
#pragma once
#include <dnnctl/memory.cuh>
#include <dnnctl/stage.cuh>

namespace dnnctl {

// Reductions over a whole block (through `red`, a shared array of >= 32 floats) ...
template <int NWARPS>
struct BlockReduce {
  float* red;
  __device__ __forceinline__ float sum(float v) const { return block_sum<NWARPS>(v, red); }
  __device__ __forceinline__ float max(float v) const { return block_max<NWARPS>(v, red); }
};

// ... or over WIDTH consecutive lanes of a warp (shuffles only; every lane must call).
template <int WIDTH>
struct GroupReduce {
  __device__ __forceinline__ float sum(float v) const { return group_sum<WIDTH>(v); }
  __device__ __forceinline__ float max(float v) const { return group_max<WIDTH>(v); }
};

// A row held in registers: thread `lane` of the STRIDE threads that share the row holds NV
// vectors, vector j starting at column c = (j * STRIDE + lane) * VEC, so a group's loads are
// contiguous. fn(j, c) runs (unrolled) for the vectors that start inside the row, c < cols;
// none when `live` is false (a thread past the last row).
template <int NV, int STRIDE, int VEC, typename F>
__device__ __forceinline__ void for_row_vecs(int lane, int cols, bool live, F&& fn) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * STRIDE + lane) * VEC;
    if (live && c < cols) fn(j, c);
  }
}

// A pass over a row of nv vectors of VEC at `src` (global memory: L = LD_NC; shared: L =
// LD_PLAIN): thread t reads vectors t, t + BLOCK, ...; fn(k, f) runs on each, f its VEC
// values in fp32. A thread that reads back from shared memory only the vectors it wrote
// itself needs no barrier.
template <int BLOCK, int VEC, int L, typename F>
__device__ __forceinline__ void row_pass(const elem_t* src, int nv, F&& fn) {
  for (int k = threadIdx.x; k < nv; k += BLOCK) {
    float f[VEC];
    load_vec<L, VEC>(src + k * VEC, f);
    fn(k, f);
  }
}

// The first pass over a row kept in shared memory `buf`, which fills it from the global row
// `xr`: vector by vector, each written to `buf` as it is read (STAGED false: one load in
// flight per loop trip), or by stage_row's cp.async copies, all in flight at once, then read
// back (STAGED true). Later passes: row_pass<BLOCK, VEC, LD_PLAIN>(buf, ...).
template <int BLOCK, int VEC, bool STAGED, typename F>
__device__ __forceinline__ void smem_row_fill(elem_t* buf, const elem_t* xr, int nv, F&& fn) {
  if constexpr (STAGED) {
    stage_row<BLOCK, VEC>(buf, xr, nv);
    row_pass<BLOCK, VEC, LD_PLAIN>(buf, nv, fn);
  } else {
    row_pass<BLOCK, VEC, LD_NC>(xr, nv, [&](int k, auto& f) {
      store_vec<ST_PLAIN, VEC>(buf + k * VEC, f);  // exact: f came from elem_t
      fn(k, f);
    });
  }
}

// Split rows (grid: splits x rows): block blockIdx.x handles columns [blockIdx.x * chunk,
// min(cols, (blockIdx.x + 1) * chunk)) of the row at `xr`, thread t the vectors starting at
// begin + t * VEC, + BLOCK * VEC, ...; fn(c, f) runs on each, c its first column.
template <int BLOCK, int VEC, typename F>
__device__ __forceinline__ void chunk_pass(const elem_t* xr, int cols, int chunk, F&& fn) {
  const int begin = blockIdx.x * chunk;
  const int end = min(cols, begin + chunk);
  for (int c = begin + (int)threadIdx.x * VEC; c < end; c += BLOCK * VEC) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + c, f);
    fn(c, f);
  }
}

}  // namespace dnnctl
