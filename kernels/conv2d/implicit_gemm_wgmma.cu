// dnnctl conv2d implicit GEMM on Hopper wgmma (sm_90a), NHWC, fp16 / bf16: the patch matrix
// (M = N*P*Q output pixels x K_gemm = R*S*Cg, reduction index kk = (r * S + s) * Cg + c) is
// gathered on the fly by cp.async into the 128-byte swizzled K-major tile wgmma reads
// (dnnctl/wgmma_core.cuh), B is the weight tensor itself (per group a Kg x K_gemm K-major
// matrix). Channels per group must be a multiple of 4 (8- or 16-byte pieces); the host pads
// other channel counts with zeros first (kernels/conv2d/implicit_gemm_pad.cu), so a C=3 first
// layer runs here too. Grid: x = tiles, z = groups * splits; split-K writes fp32 partials
// that kernels/gemm/epilogue.cu finishes. Epilogue: dnnctl/epilogue.cuh, row-major NHWC out.
//
// Defines: DNNCTL_DTYPE 1|2, GEMM_BM, GEMM_BN, GEMM_WM (4 warps per warpgroup), GEMM_STAGES,
// GEMM_VEC_A (4|8, divides Cg), GEMM_VEC_B (divides K_gemm), EPI_ACT, EPI_BIAS, EPI_RES,
// EPI_OUT (0 store | 1 partial), EPI_PAIR.
#include <dnnctl/conv_gemm.cuh>
#include <dnnctl/wgmma_core.cuh>
#include <dnnctl/gemm_macros.cuh>  // after wgmma_core.cuh: the wgmma tile defaults

using namespace dnnctl;

#if DNNCTL_DTYPE == 0
#error "implicit_gemm_wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif
static_assert(GEMM_VEC_A == 4 || GEMM_VEC_A == 8,
              "8- or 16-byte pieces (the host pads other channel counts)");

typedef WgCfg<elem_t, GEMM_BM, GEMM_BN, GEMM_WM / 4, GEMM_STAGES, true, true> Cfg;
typedef NhwcPatchGather<Cfg, Cfg::TileA, GEMM_BM, WG_BK, GEMM_VEC_A> LoaderA;
typedef MatLoader<Cfg, GEMM_BN, WG_BK, GEMM_VEC_B, true, Cfg::TileB> LoaderB;
typedef MacroEpilogue<> Epi;

// Two blocks per SM where two rings fit (228 KB per SM, 1 KB reserved per block) and two
// warpgroups hold at most 64 accumulators each (registers <= 128): one block's prologue and
// epilogue then overlap the other's mainloop.
constexpr int kMinBlocks =
    (Cfg::NT == 256 && Cfg::MT * Cfg::BN / 2 <= 64 && 2 * (Cfg::SMEM_BYTES + 1024) <= 228 * 1024)
        ? 2
        : 1;

extern "C" __global__ void __launch_bounds__(Cfg::NT, kMinBlocks)
    conv_implicit_gemm_wgmma(const elem_t* x, const elem_t* w, elem_t* y, const elem_t* bias,
                             const elem_t* res, float* ws, int N, int C, int H, int W, int K,
                             int R, int S, int P, int Q, int sh, int sw, int pt, int pl, int dh,
                             int dw, int groups, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  unsigned char* smem = wg_align_smem(smem_raw);
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dw,
                       C / groups, K / groups};
  LoaderA la;
  LoaderB lb;
  Epi e;
  const SplitKTile t = conv_gemm_setup<GEMM_BM, GEMM_BN, WG_BK, true, EPI_OUT>(
      la, lb, e, g, groups, x, w, y, bias, res, ws, splits, kchunk);
  wg_gemm_block<Cfg>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
}
