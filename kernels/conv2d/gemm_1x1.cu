// dnnctl conv2d gemm_1x1 for strided 1x1 convolutions (stride 1 runs kernels/gemm/gemm.cu
// directly): the GEMM core with one operand's rows / columns found by index math.
//
//   NHWC (CONV_NHWC 1), per group g: Y[m, k] = sum_c X[pix(m), g*Cg + c] * W[g*Kg + k, c],
//        m = (n, p, q) and pix(m) = (n, p*sh, q*sw): A rows are gathered (VEC channels per
//        copy), B is the weight (Kg x Cg, K-contiguous), output row-major with ldc = K.
//   NCHW (CONV_NHWC 0), per image n: Y_n[k, j] = sum_c W[k, c] * X_n[c, pix(j)], j = (p, q):
//        A is the weight (K x C), B columns are gathered one element at a time (consecutive
//        threads on consecutive output pixels), output Y_n row-major (K x P*Q), bias per row.
// Grid: x = tiles, z = (groups or images) * splits.
//
// Defines: DNNCTL_DTYPE, GEMM_MATH, GEMM_BM/BN/BK/WM/WN/STAGES, CONV_NHWC, GEMM_VEC_A,
// GEMM_VEC_B, EPI_ACT, EPI_BIAS, EPI_RES, EPI_OUT, EPI_PAIR.
#include <dnnctl/gemm_core.cuh>
#include <dnnctl/gemm_macros.cuh>

using namespace dnnctl;

#ifndef CONV_NHWC
#define CONV_NHWC 1
#endif

// NHWC: A K-contiguous (gathered pixels), B K-contiguous (weights).
// NCHW: A K-contiguous (weights), B N-contiguous (gathered pixels).
typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                true, CONV_NHWC != 0>
    Cfg;

#if CONV_NHWC
// A rows = strided output pixels of an NHWC input; tile [BM][BK]. Each thread owns one
// VEC-wide channel slot and the rows tid / CPR + it * (NT / CPR).
struct RowGatherLoader {
  typedef typename Cfg::T T;
  typedef SmemTile<T, GEMM_BM, GEMM_BK> Tile;
  static constexpr int VEC = GEMM_VEC_A;
  static constexpr int CPR = GEMM_BK / VEC;
  static constexpr int RSTEP = Cfg::NT / CPR;
  static constexpr int ITERS = (GEMM_BM + RSTEP - 1) / RSTEP;
  static_assert(Cfg::NT % CPR == 0, "column slots must map to threads");
  const T* x;
  int k_begin, k_end, col, row0;
  const T* pix[ITERS];  // pixel's first channel of this group; null when m >= M

  __device__ __forceinline__ void init(const T* x_, int n, int c, int h, int w, int p, int q,
                                       int sh, int sw, long long goff, int m0, int kb, int ke) {
    x = x_;
    k_begin = kb;
    k_end = ke;
    col = ((int)threadIdx.x % CPR) * VEC;
    row0 = (int)threadIdx.x / CPR;
    const int pq = p * q;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int m = m0 + row0 + it * RSTEP;
      pix[it] = nullptr;
      if (row0 + it * RSTEP < GEMM_BM && m < n * pq) {
        const int nn = m / pq, rem = m - nn * pq;
        const int pp = rem / q, qq = rem - pp * q;
        pix[it] = x + (((long long)nn * h + (long long)pp * sh) * w + (long long)qq * sw) * c +
                  goff;
      }
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) const {
    const int kk = k_begin + kt * GEMM_BK + col;
    const bool kin = kk < k_end;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * RSTEP;
      if (GEMM_BM % RSTEP != 0 && row >= GEMM_BM) break;
      const bool ok = kin && pix[it] != nullptr;
      copy_piece<T, VEC>(dst + Tile::offset(row, col), ok ? pix[it] + kk : x, ok);
    }
  }
};

#else
// B columns = strided output pixels of one NCHW image; tile [BK][BN] (N-contiguous). Each
// thread owns one column and the channel rows tid / BN + it * (NT / BN).
struct ColGatherLoader {
  typedef typename Cfg::T T;
  typedef SmemTile<T, GEMM_BK, GEMM_BN> Tile;
  static constexpr int KSTEP = Cfg::NT / GEMM_BN;
  static constexpr int ITERS = GEMM_BK / KSTEP;
  static_assert(Cfg::NT % GEMM_BN == 0 && GEMM_BK % KSTEP == 0,
                "BN must divide the thread count and BK split evenly");
  const T* x;
  int k_begin, k_end, col, krow0;
  long long plane;   // H * W
  const T* pix;      // this image's pixel (channel 0); null when j >= P*Q

  __device__ __forceinline__ void init(const T* img, const T* x_, int h, int w, int p, int q,
                                       int sh, int sw, int n0, int kb, int ke) {
    x = x_;
    k_begin = kb;
    k_end = ke;
    col = (int)threadIdx.x % GEMM_BN;
    krow0 = (int)threadIdx.x / GEMM_BN;
    plane = (long long)h * w;
    const int j = n0 + col;
    pix = nullptr;
    if (j < p * q) {
      const int pp = j / q, qq = j - pp * q;
      pix = img + (long long)pp * sh * w + (long long)qq * sw;
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) const {
    const int k0 = k_begin + kt * GEMM_BK + krow0;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int kk = k0 + it * KSTEP;
      const bool ok = kk < k_end && pix != nullptr;
      copy_piece<T, 1>(dst + Tile::offset(krow0 + it * KSTEP, col), ok ? pix + kk * plane : x,
                       ok);
    }
  }
};

#endif

typedef MacroEpilogue<> Epi;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    conv_gemm_1x1(const elem_t* x, const elem_t* w, elem_t* y, const elem_t* bias,
                  const elem_t* res, float* ws, int N, int C, int H, int W, int K, int P, int Q,
                  int sh, int sw, int groups, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
#if CONV_NHWC
  const int cg = C / groups, kg = K / groups;
  const int M = N * P * Q, NG = kg, KG = cg;
  const int batch = groups;
#else
  const int M = K, NG = P * Q, KG = C;
  const int batch = N;
#endif
  const SplitKTile t = split_k_tile<GEMM_BM, GEMM_BN, GEMM_BK>(M, NG, KG, splits, kchunk);
  const long long ws_off = slab_offset<EPI_OUT>(t, batch, M, NG);
  Epi e;
#if CONV_NHWC
  RowGatherLoader la;
  la.init(x, N, C, H, W, P, Q, sh, sw, (long long)t.bz * cg, t.m0, t.k_begin, t.k_end);
  MatLoader<Cfg, GEMM_BN, GEMM_BK, GEMM_VEC_B, true> lb;
  lb.init(w + (long long)t.bz * kg * cg, cg, t.n0, kg, t.k_begin, t.k_end);
  init_epilogue(e, y, bias, res, ws, M, NG, K, (long long)t.bz * kg, (long long)t.bz * kg,
                ws_off);
#else
  MatLoader<Cfg, GEMM_BM, GEMM_BK, GEMM_VEC_A, true> la;
  la.init(w, C, t.m0, K, t.k_begin, t.k_end);
  ColGatherLoader lb;
  lb.init(x + (long long)t.bz * C * H * W, x, H, W, P, Q, sh, sw, t.n0, t.k_begin, t.k_end);
  const long long pq = (long long)P * Q;
  init_epilogue(e, y, bias, res, ws, M, NG, pq, (long long)t.bz * K * pq, 0, ws_off);
#endif
  gemm_block<Cfg>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
}
