// Softmax, a row per block staged in shared memory (cols * sizeof(elem_t) dynamic bytes):
// one global read, one global write, three passes over shared memory. Each thread reads back
// only the vectors it staged, so the staging needs no barrier. Host: cols % VEC == 0 with
// VEC-aligned pointers (else it launches VEC = 1). The body is
// softmax_row_smem<.., STAGED = false> of <dnnctl/softmax_row.cuh>.
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
softmax_smem(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  softmax_row_smem<BLOCK, VEC, /*STAGED=*/false>(x, y, cols);
}
