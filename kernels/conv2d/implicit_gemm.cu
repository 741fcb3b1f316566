// dnnctl conv2d implicit GEMM: the convolution as a GEMM whose A operand (the im2col patch
// matrix) is gathered from the input on the fly, never materialized.
//
// Per group g: M = N*P*Q output pixels, N_gemm = K/groups output channels,
// K_gemm = C/groups * R * S. Row m = (n, p, q); column k = output channel g*Kg + k.
//   NHWC: reduction index kk = (r * S + s) * Cg + c, so VEC consecutive kk are VEC
//         consecutive channels of one input pixel (VEC divides Cg and C): cp.async of up to
//         16 bytes, zero-filled outside the image (padding) and past M / K_gemm; the gather
//         is dnnctl/conv_gemm.cuh's, shared with the wgmma kernel.
//   NCHW: kk = (c * R + r) * S + s (the weight's own order); A is gathered one element at a
//         time with consecutive threads on consecutive output pixels (coalesced along q).
// B is the weight tensor itself: per group a Kg x (Cg*R*S) row-major matrix (K-contiguous)
// for both layouts. Grid: x = tiles, z = groups * splits. Epilogue: dnnctl/epilogue.cuh,
// output row-major (NHWC) or scattered to NCHW.
//
// Defines: DNNCTL_DTYPE, GEMM_MATH, GEMM_BM/BN/BK/WM/WN/STAGES, CONV_NHWC, GEMM_VEC_A (NHWC),
// GEMM_VEC_B, EPI_ACT, EPI_BIAS, EPI_RES, EPI_OUT, EPI_PAIR.
#include <dnnctl/conv_gemm.cuh>
#include <dnnctl/gemm_macros.cuh>

using namespace dnnctl;

#ifndef CONV_NHWC
#define CONV_NHWC 1
#endif

typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                CONV_NHWC != 0, true>
    Cfg;

#if CONV_NHWC
typedef NhwcPatchGather<Cfg, SmemTile<elem_t, GEMM_BM, GEMM_BK>, GEMM_BM, GEMM_BK, GEMM_VEC_A>
    LoaderA;

#else
// NCHW patch gather: tile [BK][BM] (M-contiguous), one element per copy. Each thread owns
// one output pixel (column) and the reduction rows tid / BM + it * (NT / BM); its position
// (c, r, s) in the reduction steps by NT / BM per element, so by exactly BK per k-tile.
struct NchwPatchLoader {
  typedef typename Cfg::T T;
  typedef SmemTile<T, GEMM_BK, GEMM_BM> Tile;
  static constexpr int KSTEP = Cfg::NT / GEMM_BM;
  static constexpr int ITERS = GEMM_BK / KSTEP;
  static_assert(Cfg::NT % GEMM_BM == 0 && GEMM_BK % KSTEP == 0,
                "NCHW needs BM to divide the thread count and BK to divide evenly");
  const T* x;
  ConvShape g;
  int k_end, col, krow0, h0, w0;
  int kk, c, r, s, next_kt;
  const T* img;  // image base + this group's first channel plane; null when m >= M

  __device__ __forceinline__ void init(const T* x_, const ConvShape& g_, int group, int m0,
                                       int kb, int ke) {
    x = x_;
    g = g_;
    k_end = ke;
    col = (int)threadIdx.x % GEMM_BM;
    krow0 = (int)threadIdx.x / GEMM_BM;
    kk = kb + krow0;
    const int rs_total = g.r * g.s;
    c = kk / rs_total;
    const int rs = kk - c * rs_total;
    r = rs / g.s;
    s = rs - r * g.s;
    next_kt = 0;
    const int pq = g.p * g.q, m = m0 + col;
    img = nullptr;
    h0 = 0;
    w0 = 0;
    if (m < g.n * pq) {
      const PixelWindow pw = pixel_window(g, m);
      h0 = pw.h0;
      w0 = pw.w0;
      img = x + ((long long)pw.n * g.c + (long long)group * g.cg) * g.h * g.w;
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) {
    DNNCTL_EMU_CHECK(kt == next_kt, "NchwPatchLoader: k-tiles must be loaded in order");
    ++next_kt;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int hh = h0 + r * g.dh, ww = w0 + s * g.dw;
      const bool ok = kk < k_end && img != nullptr && (unsigned)hh < (unsigned)g.h &&
                      (unsigned)ww < (unsigned)g.w;
      const T* src = ok ? img + ((c * g.h + hh) * g.w + ww) : x;
      copy_piece<T, 1>(dst + Tile::offset(krow0 + it * KSTEP, col), src, ok);
      kk += KSTEP;
      carry_add(s, r, c, KSTEP, g.s, g.r);
    }
  }
};

typedef NchwPatchLoader LoaderA;
#endif
typedef MatLoader<Cfg, GEMM_BN, GEMM_BK, GEMM_VEC_B, true> LoaderB;
typedef MacroEpilogue<EPI_OUT, CONV_NHWC ? 0 : 1> Epi;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    conv_implicit_gemm(const elem_t* x, const elem_t* w, elem_t* y, const elem_t* bias,
                       const elem_t* res, float* ws, int N, int C, int H, int W, int K, int R,
                       int S, int P, int Q, int sh, int sw, int pt, int pl, int dh, int dw,
                       int groups, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
  const ConvShape g = {N, C, H, W, K, R, S, P, Q, sh, sw, pt, pl, dh, dw,
                       C / groups, K / groups};
  LoaderA la;
  LoaderB lb;
  Epi e;
  const SplitKTile t = conv_gemm_setup<GEMM_BM, GEMM_BN, GEMM_BK, CONV_NHWC != 0, EPI_OUT>(
      la, lb, e, g, groups, x, w, y, bias, res, ws, splits, kchunk);
  gemm_block<Cfg>(la, lb, e, smem, t.ktiles, t.m0, t.n0);
}
