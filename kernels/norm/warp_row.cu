// layer_norm / rms_norm, a row per TPR threads (part of a warp), the row in registers: one
// read, exact two-pass mean and variance from registers, one write. Host: cols <= NV*VEC*TPR,
// cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). The body is norm_row_regs of
// <dnnctl/rownorm.cuh>, reduced by shuffles within the TPR lanes.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int TPR, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK) norm_warp(NORM_ROW_PARAMS) {
  constexpr int RPB = BLOCK / TPR;
  const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
  norm_row_regs<NV, TPR, VEC>(x, w, b, y, row, cols, eps,
                              threadIdx.x % TPR, row < rows, GroupReduce<TPR>{});
}
