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

using namespace dnnctl;

#ifndef GEMM_MATH
#define GEMM_MATH 0
#endif
#ifndef GEMM_BM
#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 32
#define GEMM_WM 2
#define GEMM_WN 2
#define GEMM_STAGES 3
#endif
#ifndef GEMM_A_KMAJOR
#define GEMM_A_KMAJOR 1
#endif
#ifndef GEMM_B_KMAJOR
#define GEMM_B_KMAJOR 0
#endif
#ifndef GEMM_VEC_A
#define GEMM_VEC_A (16 / (int)sizeof(elem_t))
#endif
#ifndef GEMM_VEC_B
#define GEMM_VEC_B (16 / (int)sizeof(elem_t))
#endif
#ifndef EPI_ACT
#define EPI_ACT 0
#endif
#ifndef EPI_BIAS
#define EPI_BIAS 0
#endif
#ifndef EPI_RES
#define EPI_RES 0
#endif
#ifndef EPI_OUT
#define EPI_OUT 0
#endif
#ifndef EPI_PAIR
#define EPI_PAIR 0
#endif

#ifndef GEMM_OVERLAP
#define GEMM_OVERLAP 0
#endif

typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                GEMM_A_KMAJOR != 0, GEMM_B_KMAJOR != 0, GEMM_OVERLAP != 0>
    Cfg;
typedef MatLoader<Cfg, GEMM_A_KMAJOR ? GEMM_BM : GEMM_BK, GEMM_A_KMAJOR ? GEMM_BK : GEMM_BM,
                  GEMM_VEC_A, GEMM_A_KMAJOR != 0>
    LoaderA;
typedef MatLoader<Cfg, GEMM_B_KMAJOR ? GEMM_BN : GEMM_BK, GEMM_B_KMAJOR ? GEMM_BK : GEMM_BN,
                  GEMM_VEC_B, GEMM_B_KMAJOR != 0>
    LoaderB;
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, EPI_OUT, 0, EPI_PAIR != 0> Epi;

// EPI_OUT 3 (fused split-K): the main epilogue stores partials, then the last split of each
// tile finishes it with the store epilogue below (counters: tiles * batch zero ints).
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, OUT_STORE, 0, EPI_PAIR != 0> EpiStore;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    gemm_kernel(const elem_t* A, const elem_t* B, elem_t* C, const elem_t* bias,
                const elem_t* res, float* ws, int* counters, int M, int N, int K,
                long long lda, long long ldb, long long ldc, long long sA, long long sB,
                long long sC, long long s_bias, int batch, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
  const int bz = (int)blockIdx.z / splits, kz = (int)blockIdx.z % splits;
  int tm, tn;
  tile_coords((int)blockIdx.x, (M + GEMM_BM - 1) / GEMM_BM, (N + GEMM_BN - 1) / GEMM_BN, tm, tn);
  const int k_begin = kz * kchunk;
  const int k_end = min(K, k_begin + kchunk);
  const int ktiles = k_end > k_begin ? (k_end - k_begin + GEMM_BK - 1) / GEMM_BK : 0;

  LoaderA la;
  la.base = A + bz * sA;
  la.ld = lda;
  la.mn0 = tm * GEMM_BM;
  la.mn_lim = M;
  la.k_begin = k_begin;
  la.k_end = k_end;
  LoaderB lb;
  lb.base = B + bz * sB;
  lb.ld = ldb;
  lb.mn0 = tn * GEMM_BN;
  lb.mn_lim = N;
  lb.k_begin = k_begin;
  lb.k_end = k_end;

  Epi e;
  e.c = C;
  e.bias = bias;
  e.res = res;
  e.ws = ws;
  e.m = M;
  e.n = N;
  e.ldc = ldc;
  e.c_off = bz * sC;
  e.bias_off = bz * s_bias;
  const bool slabs = EPI_OUT == OUT_PARTIAL || EPI_OUT == OUT_FUSED;
  e.ws_off = (long long)(slabs ? kz * batch + bz : bz) * M * N;
  e.pq = 1;
  e.img_stride = 0;
  gemm_block<Cfg>(la, lb, e, smem, ktiles, tm * GEMM_BM, tn * GEMM_BN);
  if (EPI_OUT == OUT_FUSED) {
    EpiStore es;
    es.c = C;
    es.bias = bias;
    es.res = res;
    es.ws = ws;
    es.m = M;
    es.n = N;
    es.ldc = ldc;
    es.c_off = bz * sC;
    es.bias_off = bz * s_bias;
    es.ws_off = 0;
    es.pq = 1;
    es.img_stride = 0;
    splitk_fused_finish<Cfg>(es, ws, (long long)batch * M * N, (long long)bz * M * N, splits,
                             counters + (long long)bz * gridDim.x + blockIdx.x, smem,
                             tm * GEMM_BM, tn * GEMM_BN);
  }
}
