// layer_norm / rms_norm, a row per block staged in shared memory (cols * sizeof(elem_t)
// dynamic bytes): one global read, exact two-pass statistics over shared memory, one global
// write. Each thread reads back only what it staged (no barrier needed for the staging).
// Host: cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). The body is
// norm_row_smem<.., STAGED = false> of <dnnctl/rownorm.cuh>.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) norm_smem(NORM_ROW_PARAMS) {
  norm_row_smem<BLOCK, VEC, /*STAGED=*/false>(x, w, b, y, cols, eps);
}
