// Activation, exact grid: every thread handles UNROLL vectors of VEC elements once; the grid
// is ceil(n / (VEC * UNROLL * BLOCK)) blocks. See <dnnctl/activation.cuh> for the defines.
#include <dnnctl/activation.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int UNROLL, typename I>
__global__ void __launch_bounds__(BLOCK) act_exact(ACT_PARAMS) {
  const I nvec = n / VEC;
  const I base = (I)blockIdx.x * (I)(BLOCK * UNROLL) + threadIdx.x;
  act_tile<BLOCK, VEC, UNROLL, I>(x, bias, y, base, nvec, inner, C, slope);
  act_tail<VEC, I>(x, bias, y, n, nvec, inner, C, slope);
}
