// layer_norm / rms_norm, a row per block, the row in registers (NV vectors of VEC per
// thread): one read, exact two-pass statistics from registers, one write. Host:
// cols <= NV*VEC*BLOCK, cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). The body is
// norm_row_regs of <dnnctl/rownorm.cuh>, reduced across the block.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK) norm_block(NORM_ROW_PARAMS) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  norm_row_regs<NV, BLOCK, VEC>(x, w, b, y, row, cols, eps, threadIdx.x,
                                true, BlockReduce<BLOCK / 32>{red});
}
