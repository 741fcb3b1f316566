// dnnctl Hopper GEMM (sm_90a): C[b] = act(A[b] * B[b] + bias) (+ residual), batched and
// split-K, on wgmma.mma_async with operands in 128-byte swizzled shared memory (see
// dnnctl/wgmma_core.cuh for the pipeline, dnnctl/wgmma.cuh for the PTX layout rules).
// fp16 / bf16 inputs and output, fp32 accumulation.
//
// Same arguments, grid and epilogue modes as kernels/gemm/gemm.cu (the host launcher is
// shared, dnnctl/ops/matmul/gemm_launch.py). Defines:
//   DNNCTL_DTYPE 1|2        half / bfloat16
//   GEMM_BM, GEMM_BN        block tile (BM a multiple of 64 per warpgroup; BN 64/128/256)
//   GEMM_WM                 warps (4 per warpgroup: 4 or 8); GEMM_STAGES >= 3
//   GEMM_A_KMAJOR, GEMM_B_KMAJOR, GEMM_VEC_A, GEMM_VEC_B, EPI_*   as in gemm.cu
//   GEMM_SWAP 0|1           1: the operands come swapped (A = the product's B^T, B = its A^T,
//                           M and N exchanged: the tile grid runs over C^T, which suits
//                           skinny products: M <= 64 becomes the wgmma N); C, its epilogue
//                           and the split-K slabs stay in C's own coordinates.
#include <dnnctl/wgmma_core.cuh>
#include <dnnctl/gemm_macros.cuh>  // after wgmma_core.cuh: the wgmma tile defaults

using namespace dnnctl;

#ifndef GEMM_SWAP
#define GEMM_SWAP 0
#endif

#if DNNCTL_DTYPE == 0
#error "wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

typedef WgCfg<elem_t, GEMM_BM, GEMM_BN, GEMM_WM / 4, GEMM_STAGES, GEMM_A_KMAJOR != 0,
              GEMM_B_KMAJOR != 0>
    Cfg;
typedef MatLoaderA<Cfg, GEMM_VEC_A> LoaderA;
typedef MatLoaderB<Cfg, GEMM_VEC_B> LoaderB;
typedef MacroEpilogue<> Epi;
typedef MacroEpilogue<OUT_STORE> EpiStore;

// The tile in C's coordinates, for the fused split-K finish.
struct FinishTile {
  static constexpr int BM = GEMM_SWAP ? GEMM_BN : GEMM_BM;
  static constexpr int BN = GEMM_SWAP ? GEMM_BM : GEMM_BN;
  static constexpr int NT = Cfg::NT;
};

// Two blocks per SM where two rings fit (228 KB per SM, 1 KB reserved per block) and two
// warpgroups hold at most 64 accumulators each (registers <= 128): one block's prologue and
// epilogue then overlap the other's mainloop.
// (Not with single-element loads: their address registers would spill under 128.)
constexpr int kMinBlocks =
    (Cfg::NT == 256 && Cfg::MT * Cfg::BN / 2 <= 64 && GEMM_VEC_A > 1 && GEMM_VEC_B > 1 &&
     2 * (Cfg::SMEM_BYTES + 1024) <= 228 * 1024)
        ? 2
        : 1;

extern "C" __global__ void __launch_bounds__(Cfg::NT, kMinBlocks)
    gemm_kernel(const elem_t* A, const elem_t* B, elem_t* C, const elem_t* bias,
                const elem_t* res, float* ws, int* counters, int M, int N, int K,
                long long lda, long long ldb, long long ldc, long long sA, long long sB,
                long long sC, long long s_bias, int batch, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  unsigned char* smem = wg_align_smem(smem_raw);
  const SplitKTile t = split_k_tile<GEMM_BM, GEMM_BN, WG_BK>(M, N, K, splits, kchunk);
  LoaderA la;
  la.init(A + t.bz * sA, lda, t.m0, M, t.k_begin, t.k_end);
  LoaderB lb;
  lb.init(B + t.bz * sB, ldb, t.n0, N, t.k_begin, t.k_end);

  const int Mc = GEMM_SWAP ? N : M, Nc = GEMM_SWAP ? M : N;  // C's rows and columns
  Epi e;
  init_epilogue(e, C, bias, res, ws, Mc, Nc, ldc, t.bz * sC, t.bz * s_bias,
                slab_offset<EPI_OUT>(t, batch, M, N));
  wg_gemm_block<Cfg, GEMM_SWAP != 0>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
  if (EPI_OUT == OUT_FUSED) {
    EpiStore es;
    init_epilogue(es, C, bias, res, ws, Mc, Nc, ldc, t.bz * sC, t.bz * s_bias, 0);
    splitk_fused_finish<FinishTile>(es, ws, (long long)batch * M * N, (long long)t.bz * M * N,
                                    splits, counters + (long long)t.bz * gridDim.x + blockIdx.x,
                                    smem, GEMM_SWAP ? t.n0 : t.m0, GEMM_SWAP ? t.m0 : t.n0);
  }
}
