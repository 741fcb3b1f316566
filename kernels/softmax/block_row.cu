// Softmax, a row per block, the row in registers (NV vectors of VEC per thread): one read,
// one write, block reductions through shared memory. Host: cols <= NV * VEC * BLOCK and
// cols % VEC == 0 with VEC-aligned pointers (else it launches VEC = 1). The body is
// softmax_row_regs of <dnnctl/softmax_row.cuh>.
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_block(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  __shared__ float red[32];
  const i64 row = blockIdx.x;
  softmax_row_regs<NV, BLOCK, VEC>(x, y, row, cols, threadIdx.x, true,
                                   BlockReduce<BLOCK / 32>{red});
}
