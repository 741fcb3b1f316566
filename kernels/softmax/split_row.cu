// Softmax for few long rows: each row is split into chunks of CHUNK elements handled by
// separate blocks (grid: splits x rows). softmax_split_stats writes every chunk's online
// (max, sum) to `part` (rows x splits float2); softmax_split_apply folds the row's partials in
// a fixed order (so every block of a row gets bit-identical statistics) and writes its chunk,
// which was read moments ago and is mostly still in L2. Host: chunk % VEC == 0,
// cols % VEC == 0 with VEC-aligned pointers (else VEC = 1), rows <= 65535.
#include <dnnctl/softmax.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_split_stats(const elem_t* __restrict__ x, float2* __restrict__ part, int rows, int cols,
                    int chunk) {
  __shared__ float red[32];
  const i64 row = blockIdx.y;
  const int begin = blockIdx.x * chunk;
  const int end = min(cols, begin + chunk);
  const elem_t* xr = x + row * cols;
  MaxSum a = maxsum_init();
  for (int c = begin + (int)threadIdx.x * VEC; c < end; c += BLOCK * VEC) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + c, f);
    maxsum_add_vec<VEC>(a, f);
  }
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
  const int begin = blockIdx.x * chunk;
  const int end = min(cols, begin + chunk);
  const elem_t* xr = x + row * cols;
  elem_t* yr = y + row * cols;
  for (int c = begin + (int)threadIdx.x * VEC; c < end; c += BLOCK * VEC) {
    float f[VEC];
    load_vec<LD_NC, VEC>(xr + c, f);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = softmax_out(f[i], t.m, r);
    store_vec<ST_PLAIN, VEC>(yr + c, f);
  }
}
