// global_avg_pool2d, one pass, U loads in flight per thread: gap_reduce's kernels issue one
// load per loop trip (the add waits for it before the next load), so a block has BLOCK
// vectors in flight; here each trip issues U independent loads first, then adds them.
// NCHW (gap_planes_u): TPP threads (part of a warp) per plane of hw contiguous values.
// NHWC (gap_rows_u): a block per (n, tile of `lanes` channel vectors); its BLOCK / lanes rows
// of threads stride over the pixels, then fold through shared memory (BLOCK * VEC floats).
// Host: NCHW hw % VEC == 0, NHWC C % VEC == 0, VEC-aligned pointers (else VEC = 1). Bodies
// in <dnnctl/gap.cuh>.
#include <dnnctl/gap.cuh>

using namespace dnnctl;

template <int BLOCK, int TPP, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
gap_planes_u(const elem_t* __restrict__ x, elem_t* __restrict__ y, i64 planes, int hw) {
  gap_planes_mean<BLOCK, TPP, VEC, U>(x, y, planes, hw);
}

template <int BLOCK, int VEC, int U>
__global__ void __launch_bounds__(BLOCK)
gap_rows_u(const elem_t* __restrict__ x, elem_t* __restrict__ y, int hw, int C, int lanes) {
  gap_rows_mean<BLOCK, VEC, U>(x, y, hw, C, lanes);
}
