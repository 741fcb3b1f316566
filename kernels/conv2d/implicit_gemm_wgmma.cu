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
#include <dnnctl/wgmma_core.cuh>

using namespace dnnctl;

#ifndef GEMM_BM
#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_WM 8
#define GEMM_STAGES 4
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

#if DNNCTL_DTYPE == 0
#error "implicit_gemm_wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

typedef WgCfg<elem_t, GEMM_BM, GEMM_BN, GEMM_WM / 4, GEMM_STAGES, true, true> Cfg;

struct ConvShape {
  int n, c, h, w, k, r, s, p, q, sh, sw, pt, pl, dh, dw, cg, kg;
};

// NHWC patch gather into the [BM][64] tile: each thread owns one VEC-wide column slot and the
// rows tid / CPR + it * (NT / CPR); per row the (image offset, h0, w0) are computed once, and
// the column's reduction position (c, r, s) steps by 64 from one k-tile to the next.
template <int VEC>
struct WgNhwcGather {
  typedef typename Cfg::T T;
  typedef typename Cfg::TileA Tile;
  static constexpr int CPR = WG_BK / VEC;
  static constexpr int RSTEP = Cfg::NT / CPR;
  static constexpr int ITERS = (GEMM_BM + RSTEP - 1) / RSTEP;
  static_assert(VEC == 4 || VEC == 8, "8- or 16-byte pieces (the host pads other channels)");
  static_assert(Cfg::NT % CPR == 0, "column slots must map to threads");
  const T* x;  // input base (a valid address for predicated-off copies)
  ConvShape g;
  int k_end, col, row0;
  int kk, c, r, s, next_kt;  // this thread's column position in the reduction
  int h0[ITERS], w0[ITERS];
  int img[ITERS];  // element offset of the row's image + this group's first channel; -1 past M

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
      img[it] = -1;
      h0[it] = 0;
      w0[it] = 0;
      if (row0 + it * RSTEP < GEMM_BM && m < mtot) {
        const int nn = m / pq, rem = m - nn * pq;
        const int pp = rem / g.q, qq = rem - pp * g.q;
        h0[it] = pp * g.sh - g.pt;
        w0[it] = qq * g.sw - g.pl;
        img[it] = nn * g.h * g.w * g.c + group * g.cg;  // < 2^31: conv2d refuses larger
      }
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) {
    DNNCTL_EMU_CHECK(kt == next_kt, "WgNhwcGather: k-tiles must be loaded in order");
    const bool kin = kk < k_end;
    const int dy = r * g.dh, dx = s * g.dw;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * RSTEP;
      if (GEMM_BM % RSTEP != 0 && row >= GEMM_BM) break;
      const int hh = h0[it] + dy, ww = w0[it] + dx;
      const bool ok = kin && img[it] >= 0 && (unsigned)hh < (unsigned)g.h &&
                      (unsigned)ww < (unsigned)g.w;
      const T* src = ok ? x + (img[it] + (hh * g.w + ww) * g.c + c) : x;
      copy_piece<T, VEC>(dst + Tile::offset(row, col), src, ok);
    }
    // step to the next k-tile: kk += 64, carrying channel overflow into s, then r
    ++next_kt;
    kk += WG_BK;
    c += WG_BK;
    while (c >= g.cg) {
      c -= g.cg;
      if (++s == g.s) {
        s = 0;
        ++r;
      }
    }
  }
};

typedef WgNhwcGather<GEMM_VEC_A> LoaderA;
typedef MatLoader<Cfg, GEMM_BN, WG_BK, GEMM_VEC_B, true, Cfg::TileB> LoaderB;
typedef Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES != 0, EPI_OUT, 0, EPI_PAIR != 0> Epi;

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
  const int ktiles = k_end > k_begin ? (k_end - k_begin + WG_BK - 1) / WG_BK : 0;

  LoaderA la;
  la.init(x, g, group, tm * GEMM_BM, k_begin, k_end);
  LoaderB lb;
  lb.base = w + (long long)group * g.kg * KG;
  lb.ld = KG;
  lb.mn0 = tn * GEMM_BN;
  lb.mn_lim = g.kg;
  lb.k_begin = k_begin;
  lb.k_end = k_end;

  Epi e;
  e.c = y;
  e.bias = bias;
  e.res = res;
  e.ws = ws;
  e.m = M;
  e.n = g.kg;
  e.ldc = K;
  e.c_off = (long long)group * g.kg;
  e.bias_off = (long long)group * g.kg;
  e.ws_off = (long long)(EPI_OUT == OUT_PARTIAL ? kz * groups + group : group) * M * g.kg;
  e.pq = (long long)P * Q;
  e.img_stride = (long long)K * P * Q;
  wg_gemm_block<Cfg>(la, lb, e, smem, ktiles, tm * GEMM_BM, tn * GEMM_BN);
}
