// Softmax, a row per block staged in shared memory by cp.async (cols * sizeof(elem_t)
// dynamic bytes): all of a thread's copies are in flight at once (block_smem issues one load
// per loop trip), then max, sum and output from shared memory: one global read, one global
// write. Each thread reads back only the vectors it copied, so its own cp.async wait is the
// only synchronization the staging needs. Host: cols % VEC == 0 with VEC-aligned pointers
// (else VEC = 1). The body is softmax_row_smem<.., STAGED = true> of <dnnctl/softmax_row.cuh>.
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_async(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  softmax_row_smem<BLOCK, VEC, /*STAGED=*/true>(x, y, cols);
}
