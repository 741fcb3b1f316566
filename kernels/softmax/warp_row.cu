// Softmax, a row per TPR threads (a warp or an aligned part of one), the row in registers:
// one read, one write, reductions by shuffles. Thread `lane` holds vectors lane, lane + TPR,
// ... (NV of them), so a group's loads are contiguous. Host: cols <= NV * VEC * TPR and
// cols % VEC == 0 with VEC-aligned pointers (else it launches VEC = 1). The body is
// softmax_row_regs of <dnnctl/softmax_row.cuh>.
#include <dnnctl/softmax_row.cuh>

using namespace dnnctl;

template <int BLOCK, int TPR, int VEC, int NV>
__global__ void __launch_bounds__(BLOCK)
softmax_warp(const elem_t* __restrict__ x, elem_t* __restrict__ y, int rows, int cols) {
  constexpr int RPB = BLOCK / TPR;
  const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
  softmax_row_regs<NV, TPR, VEC>(x, y, row, cols, threadIdx.x % TPR,
                                 row < rows, GroupReduce<TPR>{});
}
