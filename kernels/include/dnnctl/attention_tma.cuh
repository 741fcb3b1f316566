// dnnctl attention on Hopper: what the TMA kernels (fwd_wgmma.cu, bwd_wgmma.cu) share -- the
// head-dim and layout defines and the copy of a tile of sequence rows.
//
// Tensor maps (dnnctl/ops/attention/wgmma.py), 3-d, innermost the head dim:
//   ATT_LAYOUT 0 (BHSD): {D, seq, batch * heads}, box {64, rows, 1}: (d0, row, b * H + h);
//   ATT_LAYOUT 1 (BSHD, varlen): {D, heads, batch * seq (varlen: total)}, box {64, 1, rows}:
//     (d0, h, first row of the sequence + row).
//
// Defines (with those of <dnnctl/attention.cuh>): ATT_D, ATT_DV (head dims of q / k and of
// v), ATT_STAGES (ring depth), ATT_LAYOUT 0|1.
#pragma once
#include <dnnctl/attention.cuh>
#include <dnnctl/tma.cuh>

#ifndef ATT_D
#define ATT_D 128
#endif
#ifndef ATT_DV
#define ATT_DV ATT_D
#endif
#ifndef ATT_STAGES
#define ATT_STAGES 2
#endif
#ifndef ATT_LAYOUT
#define ATT_LAYOUT 0
#endif

namespace dnnctl {

// The `chunks` 64-wide boxes of `rows` rows starting at sequence row `row` of head `head`
// (of `heads`) of batch b into shared address dst, chunk c at dst + c * chunk_bytes;
// seq_base is the sequence's first row in the BSHD map (batch * seq, or cu_seqlens[b]).
__device__ __forceinline__ void load_rows(unsigned dst, const TmaMap* map, int chunks,
                                          int chunk_bytes, int row, int head, int heads,
                                          int b, int seq_base, unsigned bar) {
  for (int c = 0; c < chunks; ++c) {
#if ATT_LAYOUT == 0
    tma_load_3d(dst + c * chunk_bytes, map, 64 * c, row, b * heads + head, bar);
#else
    tma_load_3d(dst + c * chunk_bytes, map, 64 * c, head, seq_base + row, bar);
#endif
  }
}

}  // namespace dnnctl
