// Softmax for few long rows: each row is split into chunks of CHUNK elements handled by
// separate blocks (grid: splits x rows). softmax_split_stats writes every chunk's online
// (max, sum) to `part` (rows x splits float2); softmax_split_apply folds the row's partials in
// a fixed order (so every block of a row gets bit-identical statistics) and writes its chunk,
// which was read moments ago and is mostly still in L2. Host: chunk % VEC == 0,
// cols % VEC == 0 with VEC-aligned pointers (else VEC = 1), rows <= 65535.
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_split_stats(const elem_t* __restrict__ x, float2* __restrict__ part, int rows, int cols,
                    int chunk) {
  __shared__ float red[32];
  const i64 row = blockIdx.y;
  MaxSum a = maxsum_init();
  chunk_pass<BLOCK, VEC>(x + row * cols, cols, chunk,
                         [&](int, auto& f) { maxsum_add_vec<VEC>(a, f); });
  const MaxSum t = block_maxsum<BLOCK / 32>(a, red);
  if (threadIdx.x == 0) part[row * gridDim.x + blockIdx.x] = make_float2(t.m, t.s);
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_split_apply(const elem_t* __restrict__ x, const float2* __restrict__ part,
                    elem_t* __restrict__ y, int rows, int cols, int chunk) {
  const i64 row = blockIdx.y;
  MaxSum t = maxsum_init();
  for (int i = 0; i < (int)gridDim.x; ++i) {
    const float2 p = part[row * gridDim.x + i];
    t = maxsum_combine(t, MaxSum{p.x, p.y});
  }
  const float r = softmax_scale(t.s);
  elem_t* yr = y + row * cols;
  chunk_pass<BLOCK, VEC>(x + row * cols, cols, chunk,
                         [&](int c, auto& f) { softmax_store(yr + c, f, t.m, r); });
}
