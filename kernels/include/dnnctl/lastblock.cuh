// "Last block folds": per-channel partial sums written by the blocks of a grid, folded by
// whichever block of a channel tile finishes last (a counter per tile, after a fence), with
// no grid-wide barrier (blocks need not be co-resident) and in a fixed order (deterministic).
// Partials are split-major pairs: part[(s * C + c) * 2 + {0, 1}].
#pragma once
#include <dnnctl/memory.cuh>

namespace dnnctl {

// Whole block: true in the last block (of `blocks`) to pass this point for `tile`; that block
// resets the counter for the next launch. `flag`: a shared int.
__device__ __forceinline__ bool last_block_of_tile(int* counter, int tile, int blocks,
                                                   int* flag) {
  __threadfence();  // this block's partials are visible before the count says so
  sync_block();
  if (threadIdx.x == 0) {
    *flag = atomicAdd(counter + tile, 1) == blocks - 1;
    if (*flag) counter[tile] = 0;  // every block of this launch has counted
  }
  sync_block();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// The S partial pairs of channels c0 .. c0 + CT - 1 (< C) folded by the whole block: on return
// red[j] and red[CT + j] hold the two sums of channel c0 + j. `red`: shared memory of at least
// 2 * max(CT, BLOCK) floats. Reads go through L2 (__ldcg: other SMs wrote them).
template <int BLOCK, int CT>
__device__ __forceinline__ void fold_tile(const float* part, int S, int C, int c0, float* red) {
  constexpr int NSL = CT >= BLOCK ? 1 : BLOCK / CT;  // slices of the S partials per channel
  sync_block();  // (callers may have used red)
  for (int j = (int)threadIdx.x % (NSL == 1 ? BLOCK : CT); j < CT;
       j += (NSL == 1 ? BLOCK : CT)) {
    const int sl = NSL == 1 ? 0 : (int)threadIdx.x / CT;
    if (sl >= NSL) break;
    float a = 0.f, b = 0.f;
    if (c0 + j < C) {
      for (int s = sl; s < S; s += NSL) {
        a += __ldcg(part + ((i64)s * C + c0 + j) * 2);
        b += __ldcg(part + ((i64)s * C + c0 + j) * 2 + 1);
      }
    }
    red[(0 * NSL + sl) * CT + j] = a;
    red[(1 * NSL + sl) * CT + j] = b;
  }
  sync_block();
  if (NSL > 1) {
    float a[(CT + BLOCK - 1) / BLOCK], b[(CT + BLOCK - 1) / BLOCK];
#pragma unroll
    for (int q = 0; q < (CT + BLOCK - 1) / BLOCK; ++q) {
      const int j = (int)threadIdx.x + q * BLOCK;
      a[q] = b[q] = 0.f;
      if (j < CT) {
        for (int sl = 0; sl < NSL; ++sl) {
          a[q] += red[(0 * NSL + sl) * CT + j];
          b[q] += red[(1 * NSL + sl) * CT + j];
        }
      }
    }
    sync_block();
#pragma unroll
    for (int q = 0; q < (CT + BLOCK - 1) / BLOCK; ++q) {
      const int j = (int)threadIdx.x + q * BLOCK;
      if (j < CT) {
        red[j] = a[q];
        red[CT + j] = b[q];
      }
    }
    sync_block();
  }
}

}  // namespace dnnctl
