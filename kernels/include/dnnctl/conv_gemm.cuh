// dnnctl conv2d implicit GEMM pieces shared by the mma.sync kernel
// (kernels/conv2d/implicit_gemm.cu) and the wgmma one (implicit_gemm_wgmma.cu): the NHWC
// patch gather and the setup of one block (operands, epilogue, k range).
//
// Per group: M = N*P*Q output pixels, N_gemm = Kg output channels, K_gemm = Cg*R*S; in NHWC
// the reduction index is kk = (r * S + s) * Cg + c, so VEC consecutive kk are VEC consecutive
// channels of one input pixel. Include as <dnnctl/conv_gemm.cuh>.
#pragma once
#include <dnnctl/conv_shape.cuh>
#include <dnnctl/gemm_core.cuh>

namespace dnnctl {

// NHWC patch gather into Tile, BM output pixels x BK reduction columns (K-contiguous): each
// thread owns one VEC-wide column slot and the rows tid / CPR + it * (NT / CPR); per row the
// (image offset, h0, w0) are computed once, and the column's reduction position (c, r, s)
// steps by BK from one k-tile to the next. Pieces are cp.async copies of VEC channels,
// zero-filled outside the image (padding) and past M / K_gemm.
template <class Cfg, class Tile, int BM, int BK, int VEC>
struct NhwcPatchGather {
  typedef typename Cfg::T T;
  static constexpr int CPR = BK / VEC;
  static constexpr int RSTEP = Cfg::NT / CPR;
  static constexpr int ITERS = (BM + RSTEP - 1) / RSTEP;
  static_assert(BK % VEC == 0 && Cfg::NT % CPR == 0, "column slots must map to threads");
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
      if (row0 + it * RSTEP < BM && m < mtot) {
        const PixelWindow pw = pixel_window(g, m);
        h0[it] = pw.h0;
        w0[it] = pw.w0;
        img[it] = pw.n * g.h * g.w * g.c + group * g.cg;  // < 2^31: conv2d refuses larger
      }
    }
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) {
    DNNCTL_EMU_CHECK(kt == next_kt, "NhwcPatchGather: k-tiles must be loaded in order");
    const bool kin = kk < k_end;
    const int dy = r * g.dh, dx = s * g.dw;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * RSTEP;
      if (BM % RSTEP != 0 && row >= BM) break;
      const int hh = h0[it] + dy, ww = w0[it] + dx;
      const bool ok = kin && img[it] >= 0 && (unsigned)hh < (unsigned)g.h &&
                      (unsigned)ww < (unsigned)g.w;
      const T* src = ok ? x + (img[it] + (hh * g.w + ww) * g.c + c) : x;
      copy_piece<T, VEC>(dst + Tile::offset(row, col), src, ok);
    }
    // step to the next k-tile: kk += BK, carrying channel overflow into s, then r
    ++next_kt;
    kk += BK;
    carry_add(c, s, r, BK, g.cg, g.s);
  }
};

// Sets up one block of an implicit-GEMM grid (x = tiles, z = groups * splits) and returns
// where it works: A = the patch gather la of its output pixels (la.init(x, g, group, m0,
// k_begin, k_end)), B = the weights of its output channels (per group a Kg x Cg*R*S
// K-contiguous matrix), the epilogue of its group with output mode OUT: NHWC output
// (CHANNELS_LAST) row-major (ldc = K), NCHW output scattered per image (OUT_LAYOUT 1).
template <int BM, int BN, int BK, bool CHANNELS_LAST, int OUT, class LA, class LB, class E,
          typename T>
__device__ __forceinline__ SplitKTile conv_gemm_setup(LA& la, LB& lb, E& e, const ConvShape& g,
                                                      int groups, const T* x, const T* w, T* y,
                                                      const T* bias, const T* res, float* ws,
                                                      int splits, int kchunk) {
  const int M = g.n * g.p * g.q, KG = g.cg * g.r * g.s;
  const SplitKTile t = split_k_tile<BM, BN, BK>(M, g.kg, KG, splits, kchunk);
  la.init(x, g, t.bz, t.m0, t.k_begin, t.k_end);
  lb.init(w + (long long)t.bz * g.kg * KG, KG, t.n0, g.kg, t.k_begin, t.k_end);
  const long long pq = (long long)g.p * g.q;
  init_epilogue(e, y, bias, res, ws, M, g.kg, g.k, (CHANNELS_LAST ? 1 : pq) * t.bz * g.kg,
                (long long)t.bz * g.kg, slab_offset<OUT>(t, groups, M, g.kg), pq, g.k * pq);
  return t;
}

}  // namespace dnnctl
