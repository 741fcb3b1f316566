// layer_norm / rms_norm, a row per block staged in shared memory by cp.async
// (cols * sizeof(elem_t) dynamic bytes): all of a thread's copies are in flight at once
// (block_smem issues one load per loop trip), then exact two-pass statistics and the output
// from shared memory: one global read, one global write. Each thread reads back only the
// vectors it copied (its own cp.async wait is the only synchronization the staging needs).
// Host: cols % VEC == 0 with VEC-aligned pointers (else VEC = 1). The body is
// norm_row_smem<.., STAGED = true> of <dnnctl/rownorm.cuh>.
#include <dnnctl/rownorm.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) norm_async(NORM_ROW_PARAMS) {
  norm_row_smem<BLOCK, VEC, /*STAGED=*/true>(x, w, b, y, cols, eps);
}
