// Activation, grid-stride loop: a fixed number of resident blocks (blocks_per_sm x SMs) walks
// the tensor in tiles of BLOCK * UNROLL vectors. See <dnnctl/activation.cuh> for the defines.
#include <dnnctl/activation.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int UNROLL, typename I>
__global__ void __launch_bounds__(BLOCK) act_stride(ACT_PARAMS) {
  const I nvec = n / VEC;
  const I tile = (I)(BLOCK * UNROLL);
  const I step = (I)gridDim.x * tile;
  for (I base = (I)blockIdx.x * tile + threadIdx.x; base < nvec; base += step)
    act_tile<BLOCK, VEC, UNROLL, I>(x, bias, y, base, nvec, inner, C, slope);
  act_tail<VEC, I>(x, bias, y, n, nvec, inner, C, slope);
}
