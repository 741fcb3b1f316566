// conv2d weight gradient as an implicit GEMM on tensor cores, split-K over N*P*Q (NHWC).
//
// Per group g: dw_g[Kg][R*S*Cg] = dy_g^T[Kg][NPQ] @ col_g[NPQ][R*S*Cg], where col is the
// forward's patch matrix, gathered on the fly (never stored). GEMM M = Kg (output channels),
// N = R*S*Cg in dw's NHWC order ((r * S + s) * Cg + c), K = N*P*Q output pixels.
//   A = dy seen M-contiguous: tile [BK pixels][BM channels], a strided row-major matrix
//       (row = pixel, ld = K) read by MatLoader, VEC_A channels per copy.
//   B = the pixel gather: tile [BK pixels][BN columns]; each thread owns one VEC_B-wide
//       column slot (fixed (r, s, c) for the whole block) and BK / RSTEP pixel rows; a row's
//       input pixel is (n, p*sh - pt + r*dh, q*sw - pl + s*dw), zero-filled outside.
// Grid: x = tiles of (Kg x R*S*Cg), z = groups * splits; split kz reduces pixels
// [kz * kchunk, (kz + 1) * kchunk). EPI_OUT: OUT_STORE (one split), OUT_PARTIAL (fp32 slabs,
// summed in split order by the finish kernel: deterministic) or OUT_ATOMIC (fp32 atomics
// into one zeroed slab: faster, order not fixed), then gemm/epilogue.cu's finish stores dw.
// Defines: DNNCTL_DTYPE, GEMM_MATH, GEMM_BM/BN/BK/WM/WN/STAGES, GEMM_VEC_A, GEMM_VEC_B,
// EPI_OUT, EPI_PAIR.
#include <dnnctl/conv_shape.cuh>
#include <dnnctl/gemm_core.cuh>
#include <dnnctl/gemm_macros.cuh>

using namespace dnnctl;

typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                false, false>
    Cfg;

template <int VEC>
struct PixelGather {
  typedef typename Cfg::T T;
  typedef SmemTile<T, GEMM_BK, GEMM_BN> Tile;
  static constexpr int CPR = GEMM_BN / VEC;
  static constexpr int RSTEP = Cfg::NT / CPR;
  static constexpr int ITERS = (GEMM_BK + RSTEP - 1) / RSTEP;
  // the host's parameter space keeps exactly these tiles (gather_fits in
  // dnnctl/ops/conv2d/wgrad_implicit_gemm.py): BN / VEC slots must not outnumber the threads
  static_assert(GEMM_BN % VEC == 0 && Cfg::NT % CPR == 0, "column slots must map to threads");
  const T* x;  // input base (a valid address for predicated-off copies)
  const T* xg;  // + this group's first channel + this thread's channel
  ConvShape g;
  int k_begin, k_end, col, row0, dy_, dx_, next_kt;  // dy_, dx_: this column's tap offset
  bool col_ok;

  __device__ __forceinline__ void init(const T* x_, const ConvShape& g_, int group, int n0,
                                       int kb, int ke) {
    x = x_;
    g = g_;
    k_begin = kb;
    k_end = ke;
    col = ((int)threadIdx.x % CPR) * VEC;
    row0 = (int)threadIdx.x / CPR;
    const int crs = n0 + col;
    col_ok = crs < g.r * g.s * g.cg;
    const int rs = col_ok ? crs / g.cg : 0;
    const int c = col_ok ? crs - rs * g.cg : 0;
    const int r = rs / g.s;
    dy_ = r * g.dh;
    dx_ = (rs - r * g.s) * g.dw;
    xg = x + (long long)group * g.cg + c;
    next_kt = 0;
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) {
    DNNCTL_EMU_CHECK(kt == next_kt, "PixelGather: k-tiles must be loaded in order");
    ++next_kt;
    const int m0 = k_begin + kt * GEMM_BK;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * RSTEP;
      if (GEMM_BK % RSTEP != 0 && row >= GEMM_BK) break;
      const int m = m0 + row;
      bool ok = col_ok && m < k_end;
      const T* src = x;
      if (ok) {
        const PixelWindow pw = pixel_window(g, m);
        const int hh = pw.h0 + dy_, ww = pw.w0 + dx_;
        ok = (unsigned)hh < (unsigned)g.h && (unsigned)ww < (unsigned)g.w;
        if (ok) src = xg + (((long long)pw.n * g.h + hh) * g.w + ww) * g.c;
      }
      copy_piece<T, VEC>(dst + Tile::offset(row, col), src, ok);
    }
  }
};

typedef MatLoader<Cfg, GEMM_BK, GEMM_BM, GEMM_VEC_A, false> LoaderA;
typedef PixelGather<GEMM_VEC_B> LoaderB;
typedef Epilogue<elem_t, 0, BIAS_NONE, RES_NONE, EPI_OUT, 0, EPI_PAIR != 0> Epi;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    conv_wgrad_implicit_gemm(const elem_t* x, const elem_t* dy, elem_t* dw, float* ws, int N,
                             int C, int H, int W, int K, int R, int S, int P, int Q, int sh,
                             int sw, int pt, int pl, int dh, int dwid, int groups, int splits,
                             int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dwid,
                       C / groups, K / groups};
  const int NG = g.cg * R * S, MPIX = N * P * Q;
  const SplitKTile t = split_k_tile<GEMM_BM, GEMM_BN, GEMM_BK>(g.kg, NG, MPIX, splits, kchunk);
  LoaderA la;
  la.init(dy + (long long)t.bz * g.kg, K, t.m0, g.kg, t.k_begin, t.k_end);
  LoaderB lb;
  lb.init(x, g, t.bz, t.n0, t.k_begin, t.k_end);
  Epi e;  // dw has no bias or residual: their pointers are never read
  init_epilogue(e, dw, dw, dw, ws, g.kg, NG, NG, (long long)t.bz * g.kg * NG, 0,
                slab_offset<EPI_OUT>(t, groups, g.kg, NG));
  gemm_block<Cfg>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
}
