// global_avg_pool2d, one pass, one load per loop trip (gap_unrolled.cu: U in flight). NCHW
// (gap_planes): TPP threads (part of a warp) reduce one plane of hw contiguous values with
// VEC-element loads and shuffles. NHWC (gap_rows): a block per (n, tile of `lanes` channel
// vectors); its BLOCK / lanes rows of threads stride over the pixels, then fold through shared
// memory (BLOCK * VEC floats). Host: NCHW hw % VEC == 0, NHWC C % VEC == 0, VEC-aligned
// pointers (else VEC = 1). Bodies in <dnnctl/gap.cuh>.
#include <dnnctl/gap.cuh>

using namespace dnnctl;

template <int BLOCK, int TPP, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_planes(const elem_t* __restrict__ x, elem_t* __restrict__ y, i64 planes, int hw) {
  gap_planes_mean<BLOCK, TPP, VEC, 1>(x, y, planes, hw);
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
gap_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, int hw, int C, int lanes) {
  gap_rows_mean<BLOCK, VEC, 1>(x, y, hw, C, lanes);
}
