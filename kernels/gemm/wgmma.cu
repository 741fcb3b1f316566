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

using namespace dnnctl;

#ifndef GEMM_BM
#define GEMM_BM 128
#define GEMM_BN 256
#define GEMM_WM 8
#define GEMM_STAGES 4
#endif
#ifndef GEMM_A_KMAJOR
#define GEMM_A_KMAJOR 1
#endif
#ifndef GEMM_B_KMAJOR
#define GEMM_B_KMAJOR 0
#endif
#ifndef GEMM_VEC_A
#define GEMM_VEC_A 8
#endif
#ifndef GEMM_VEC_B
#define GEMM_VEC_B 8
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
#ifndef GEMM_SWAP
#define GEMM_SWAP 0
#endif

#if DNNCTL_DTYPE == 0
#error "wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

typedef WgCfg<elem_t, GEMM_BM, GEMM_BN, GEMM_WM / 4, GEMM_STAGES, GEMM_A_KMAJOR != 0,
              GEMM_B_KMAJOR != 0>
    Cfg;
typedef MatLoader<Cfg, GEMM_A_KMAJOR ? GEMM_BM : WG_BK, GEMM_A_KMAJOR ? WG_BK : GEMM_BM,
                  GEMM_VEC_A, GEMM_A_KMAJOR != 0, Cfg::TileA>
    LoaderA;
typedef MatLoader<Cfg, GEMM_B_KMAJOR ? GEMM_BN : WG_BK, GEMM_B_KMAJOR ? WG_BK : GEMM_BN,
                  GEMM_VEC_B, GEMM_B_KMAJOR != 0, Cfg::TileB>
    LoaderB;
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, EPI_OUT, 0, EPI_PAIR != 0> Epi;
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, OUT_STORE, 0, EPI_PAIR != 0> EpiStore;

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
  const int bz = (int)blockIdx.z / splits, kz = (int)blockIdx.z % splits;
  int tm, tn;
  tile_coords((int)blockIdx.x, (M + GEMM_BM - 1) / GEMM_BM, (N + GEMM_BN - 1) / GEMM_BN, tm, tn);
  const int k_begin = kz * kchunk;
  const int k_end = min(K, k_begin + kchunk);
  const int ktiles = k_end > k_begin ? (k_end - k_begin + WG_BK - 1) / WG_BK : 0;

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

  const int Mc = GEMM_SWAP ? N : M, Nc = GEMM_SWAP ? M : N;  // C's rows and columns
  const int row_c = GEMM_SWAP ? tn * GEMM_BN : tm * GEMM_BM;
  const int col_c = GEMM_SWAP ? tm * GEMM_BM : tn * GEMM_BN;
  Epi e;
  e.c = C;
  e.bias = bias;
  e.res = res;
  e.ws = ws;
  e.m = Mc;
  e.n = Nc;
  e.ldc = ldc;
  e.c_off = bz * sC;
  e.bias_off = bz * s_bias;
  const bool slabs = EPI_OUT == OUT_PARTIAL || EPI_OUT == OUT_FUSED;
  e.ws_off = (long long)(slabs ? kz * batch + bz : bz) * M * N;
  e.pq = 1;
  e.img_stride = 0;
  wg_gemm_block<Cfg, GEMM_SWAP != 0>(la, lb, e, smem, ktiles, tm * GEMM_BM, tn * GEMM_BN);
  if (EPI_OUT == OUT_FUSED) {
    EpiStore es;
    es.c = C;
    es.bias = bias;
    es.res = res;
    es.ws = ws;
    es.m = Mc;
    es.n = Nc;
    es.ldc = ldc;
    es.c_off = bz * sC;
    es.bias_off = bz * s_bias;
    es.ws_off = 0;
    es.pq = 1;
    es.img_stride = 0;
    splitk_fused_finish<FinishTile>(es, ws, (long long)batch * M * N, (long long)bz * M * N,
                                    splits, counters + (long long)bz * gridDim.x + blockIdx.x,
                                    smem, row_c, col_c);
  }
}
