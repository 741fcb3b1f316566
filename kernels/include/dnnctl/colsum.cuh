// dnnctl deterministic column sums of a 32 x 8 thread block (blockDim (32, 8)): the partial
// sums of the bias and direct weight gradients, reduced in a fixed order (no atomics).
// Include as <dnnctl/colsum.cuh>.
#pragma once
#include <dnnctl/conv.cuh>

namespace dnnctl {

// The sum over threadIdx.y of acc for column threadIdx.x, in y order, returned to the threads
// of row y = 0 (others get 0). red is the block's shared scratch; every thread must call.
__device__ __forceinline__ float block_colsum_32x8(float (&red)[8][33], float acc) {
  red[threadIdx.y][threadIdx.x] = acc;
  DNNCTL_SYNC();
  float sum = 0.f;
  if (threadIdx.y == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += red[j][threadIdx.x];
  }
  return sum;
}

}  // namespace dnnctl
