// dnnctl conv2d implicit GEMM: the convolution as a GEMM whose A operand (the im2col patch
// matrix) is gathered from the input on the fly, never materialized.
//
// Per group g: M = N*P*Q output pixels, N_gemm = K/groups output channels,
// K_gemm = C/groups * R * S. Row m = (n, p, q); column k = output channel g*Kg + k.
//   NHWC: reduction index kk = (r * S + s) * Cg + c, so VEC consecutive kk are VEC
//         consecutive channels of one input pixel (VEC divides Cg and C): cp.async of up to
//         16 bytes, zero-filled outside the image (padding) and past M / K_gemm.
//   NCHW: kk = (c * R + r) * S + s (the weight's own order); A is gathered one element at a
//         time with consecutive threads on consecutive output pixels (coalesced along q).
// B is the weight tensor itself: per group a Kg x (Cg*R*S) row-major matrix (K-contiguous)
// for both layouts. Grid: x = tiles, z = groups * splits. Epilogue: dnnctl/epilogue.cuh,
// output row-major (NHWC) or scattered to NCHW.
//
// Defines: DNNCTL_DTYPE, GEMM_MATH, GEMM_BM/BN/BK/WM/WN/STAGES, CONV_NHWC, GEMM_VEC_A (NHWC),
// GEMM_VEC_B, EPI_ACT, EPI_BIAS, EPI_RES, EPI_OUT, EPI_PAIR.
#include <dnnctl/gemm_core.cuh>

using namespace dnnctl;

#ifndef CONV_NHWC
#define CONV_NHWC 1
#endif
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
#ifndef GEMM_VEC_A
#define GEMM_VEC_A 1
#endif
#ifndef GEMM_VEC_B
#define GEMM_VEC_B 1
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

typedef GemmCfg<elem_t, GEMM_MATH, GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES,
                CONV_NHWC != 0, true>
    Cfg;

struct ConvShape {
  int n, c, h, w, k, r, s, p, q, sh, sw, pt, pl, dh, dw, cg, kg;
};

#if CONV_NHWC
// NHWC patch gather: tile [BM][BK] (K-contiguous). Each thread owns one VEC-wide column
// slot and the rows tid / CPR + it * (NT / CPR); per-row (image, h0, w0) are computed once,
// and the column's reduction position (c, r, s) steps by BK from one k-tile to the next.
template <int VEC>
struct NhwcPatchLoader {
  typedef typename Cfg::T T;
  typedef SmemTile<T, GEMM_BM, GEMM_BK> Tile;
  static constexpr int CPR = GEMM_BK / VEC;
  static constexpr int RSTEP = Cfg::NT / CPR;
  static constexpr int ITERS = (GEMM_BM + RSTEP - 1) / RSTEP;
  static_assert(GEMM_BK % VEC == 0 && Cfg::NT % CPR == 0, "column slots must map to threads");
  const T* x;  // input base (a valid address for predicated-off copies)
  ConvShape g;
  int k_end, col, row0;
  int kk, c, r, s, next_kt;  // this thread's column position in the reduction
  int h0[ITERS], w0[ITERS];
  const T* img[ITERS];  // image base + this group's first channel; null when m >= M

  __device__ __forceinline__ void init(const T* x_, const ConvShape& g_, int group, int m0,
                                       int kb, int ke) {
    x = x_;
    g = g_;
    k_end = ke;
    col = ((int)threadIdx.x % CPR) * VEC;
    row0 = (int)threadIdx.x / CPR;
    kk = kb + col;
    const int rs = kk / g.cg;
    c = kk - rs * g.cg;
    r = rs / g.s;
    s = rs - r * g.s;
    next_kt = 0;
    const int pq = g.p * g.q, mtot = g.n * pq;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int m = m0 + row0 + it * RSTEP;
      img[it] = nullptr;
      h0[it] = 0;
      w0[it] = 0;
      if (row0 + it * RSTEP < GEMM_BM && m < mtot) {
        const int nn = m / pq, rem = m - nn * pq;
        const int pp = rem / g.q, qq = rem - pp * g.q;
        h0[it] = pp * g.sh - g.pt;
        w0[it] = qq * g.sw - g.pl;
        img[it] = x + (long long)nn * g.h * g.w * g.c + (long long)group * g.cg;
      }
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) {
    DNNCTL_EMU_CHECK(kt == next_kt, "NhwcPatchLoader: k-tiles must be loaded in order");
    const bool kin = kk < k_end;
    const int dy = r * g.dh, dx = s * g.dw;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * RSTEP;
      if (GEMM_BM % RSTEP != 0 && row >= GEMM_BM) break;
      const int hh = h0[it] + dy, ww = w0[it] + dx;
      const bool ok = kin && img[it] != nullptr && (unsigned)hh < (unsigned)g.h &&
                      (unsigned)ww < (unsigned)g.w;
      // 32-bit offset inside one image: conv2d refuses tensors of 2^31 elements or more
      const T* src = ok ? img[it] + ((hh * g.w + ww) * g.c + c) : x;
      copy_piece<T, VEC>(dst + Tile::offset(row, col), src, ok);
    }
    // step to the next k-tile: kk += BK, carrying channel overflow into s, then r
    ++next_kt;
    kk += GEMM_BK;
    c += GEMM_BK;
    while (c >= g.cg) {
      c -= g.cg;
      if (++s == g.s) {
        s = 0;
        ++r;
      }
    }
  }
};

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
      const int nn = m / pq, rem = m - nn * pq;
      const int pp = rem / g.q, qq = rem - pp * g.q;
      h0 = pp * g.sh - g.pt;
      w0 = qq * g.sw - g.pl;
      img = x + ((long long)nn * g.c + (long long)group * g.cg) * g.h * g.w;
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
      s += KSTEP;
      while (s >= g.s) {
        s -= g.s;
        if (++r == g.r) {
          r = 0;
          ++c;
        }
      }
    }
  }
};

#endif

#if CONV_NHWC
typedef NhwcPatchLoader<GEMM_VEC_A> LoaderA;
#else
typedef NchwPatchLoader LoaderA;
#endif
typedef MatLoader<Cfg, GEMM_BN, GEMM_BK, GEMM_VEC_B, true> LoaderB;
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, EPI_OUT, CONV_NHWC ? 0 : 1,
                 EPI_PAIR != 0>
    Epi;

extern "C" __global__ void __launch_bounds__(Cfg::NT)
    conv_implicit_gemm(const elem_t* x, const elem_t* w, elem_t* y, const elem_t* bias,
                       const elem_t* res, float* ws, int N, int C, int H, int W, int K, int R,
                       int S, int P, int Q, int sh, int sw, int pt, int pl, int dh, int dw,
                       int groups, int splits, int kchunk) {
  DNNCTL_DECLARE_SMEM(smem);
  ConvShape g;
  g.n = N; g.c = C; g.h = H; g.w = W; g.k = K; g.r = R; g.s = S; g.p = P; g.q = Q;
  g.sh = sh; g.sw = sw; g.pt = pt; g.pl = pl; g.dh = dh; g.dw = dw;
  g.cg = C / groups;
  g.kg = K / groups;
  const int M = N * P * Q, KG = g.cg * R * S;
  const int group = (int)blockIdx.z / splits, kz = (int)blockIdx.z % splits;
  int tm, tn;
  tile_coords((int)blockIdx.x, (M + GEMM_BM - 1) / GEMM_BM, (g.kg + GEMM_BN - 1) / GEMM_BN,
              tm, tn);
  const int k_begin = kz * kchunk;
  const int k_end = min(KG, k_begin + kchunk);
  const int ktiles = k_end > k_begin ? (k_end - k_begin + GEMM_BK - 1) / GEMM_BK : 0;

  LoaderA la;
  la.init(x, g, group, tm * GEMM_BM, k_begin, k_end);
  LoaderB lb;
  lb.base = w + (long long)group * g.kg * KG;
  lb.ld = KG;
  lb.mn0 = tn * GEMM_BN;
  lb.mn_lim = g.kg;
  lb.k_begin = k_begin;
  lb.k_end = k_end;

  const long long pq = (long long)P * Q;
  Epi e;
  e.c = y;
  e.bias = bias;
  e.res = res;
  e.ws = ws;
  e.m = M;
  e.n = g.kg;
  e.ldc = K;
  e.c_off = CONV_NHWC ? (long long)group * g.kg : (long long)group * g.kg * pq;
  e.bias_off = (long long)group * g.kg;
  e.ws_off = (long long)(EPI_OUT == OUT_PARTIAL ? kz * groups + group : group) * M * g.kg;
  e.pq = pq;
  e.img_stride = (long long)K * pq;
  gemm_block<Cfg>(la, lb, e, smem, ktiles, tm * GEMM_BM, tn * GEMM_BN);
}
