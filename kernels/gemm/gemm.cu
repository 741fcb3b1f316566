// dnnctl tiled GEMM: C[b] = act(A[b] * B[b] + bias) (+ residual), batched and split-K.
//
// Configured at compile time (dnnctl/ops/matmul/gemm_launch.py builds the -D list):
//   DNNCTL_DTYPE 0|1|2      float / half / bfloat16 inputs and output
//   GEMM_MATH 0|1|2         mma16 (fp16/bf16) | tf32 mma | fp32 SIMT (see gemm_core.cuh)
//   GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES   tiles, warps, pipeline depth
//   GEMM_OVERLAP 0|1        mma fragment loads overlapped with the mma (gemm_core.cuh)
//   GEMM_A_KMAJOR, GEMM_B_KMAJOR   1 when K is the contiguous index of A / B
//   GEMM_VEC_A, GEMM_VEC_B  elements per global load (divides the leading dimension)
//   EPI_ACT, EPI_BIAS (0 none, 1 per column, 2 per row), EPI_RES, EPI_OUT (0 store,
//   1 fp32 partial per split, 2 fp32 atomic, 3 partials finished in-kernel by the last
//   split of each tile), EPI_PAIR (ldc and offsets even; with 1 / 3 also N even)
//
// Grid: x = tiles of C (grouped raster), z = batch * splits. Block: GEMM_WM * GEMM_WN warps.
// Operand b of batch z / splits starts at A + b * sA; split s reduces K range
// [s * kchunk, min(K, (s + 1) * kchunk)) (kchunk is a multiple of GEMM_BK).
#include <dnnctl/gemm_core.cuh>
#include <dnnctl/gemm_macros.cuh>

using namespace dnnctl;

#ifndef GEMM_OVERLAP
#define GEMM_OVERLAP 0
#endif

typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                GEMM_A_KMAJOR != 0, GEMM_B_KMAJOR != 0, GEMM_OVERLAP != 0>
    Cfg;
typedef MatLoaderA<Cfg, GEMM_VEC_A> LoaderA;
typedef MatLoaderB<Cfg, GEMM_VEC_B> LoaderB;
typedef MacroEpilogue<> Epi;

// EPI_OUT 3 (fused split-K): the main epilogue stores partials, then the last split of each
// tile finishes it with the store epilogue (counters: tiles * batch zero ints).
typedef MacroEpilogue<OUT_STORE> EpiStore;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    gemm_kernel(const elem_t* A, const elem_t* B, elem_t* C, const elem_t* bias,
                const elem_t* res, float* ws, int* counters, int M, int N, int K,
                long long lda, long long ldb, long long ldc, long long sA, long long sB,
                long long sC, long long s_bias, int batch, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
  const SplitKTile t = split_k_tile<GEMM_BM, GEMM_BN, GEMM_BK>(M, N, K, splits, kchunk);
  LoaderA la;
  la.init(A + t.bz * sA, lda, t.m0, M, t.k_begin, t.k_end);
  LoaderB lb;
  lb.init(B + t.bz * sB, ldb, t.n0, N, t.k_begin, t.k_end);
  Epi e;
  init_epilogue(e, C, bias, res, ws, M, N, ldc, t.bz * sC, t.bz * s_bias,
                slab_offset<EPI_OUT>(t, batch, M, N));
  gemm_block<Cfg>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
  if (EPI_OUT == OUT_FUSED) {
    EpiStore es;
    init_epilogue(es, C, bias, res, ws, M, N, ldc, t.bz * sC, t.bz * s_bias, 0);
    splitk_fused_finish<Cfg>(es, ws, (long long)batch * M * N, (long long)t.bz * M * N, splits,
                             counters + (long long)t.bz * gridDim.x + blockIdx.x, smem, t.m0,
                             t.n0);
  }
}
