// dnnctl tiled GEMM core shared by the matmul and convolution kernels.
//
// A block computes a BM x BN tile of C = A (M x K) * B (K x N) over a range of K (split-K),
// with WM x WN warps. Operand tiles stream through a STAGES-deep ring of shared-memory
// buffers filled by cp.async (zero-filled outside the matrix), one __syncthreads per k-tile:
//
//   prologue: issue k-tiles 0 .. STAGES-2, one commit group each
//   kt:       wait until k-tile kt landed; sync (everyone also left k-tile kt-1's buffer);
//             issue k-tile kt+STAGES-1 into that buffer; compute on k-tile kt.
//
// Math policies: MATH_MMA16 (fp16/bf16 mma.sync m16n8k16 with ldmatrix), MATH_TF32 (fp32 data,
// mma.sync m16n8k8 on tf32-rounded values), MATH_SIMT (fp32 FFMA). Loaders decide where the
// elements come from (a strided matrix here; an implicit im2col gather in the conv kernels).
//
// Shared-memory tiles are rows of 16-byte chunks with an XOR swizzle of the chunk index, so
// cp.async stores, ldmatrix and the scalar fragment loads are free of bank conflicts.
#pragma once
#include <dnnctl/epilogue.cuh>
#include <dnnctl/gemm_grid.cuh>
#include <dnnctl/ptx.cuh>

namespace dnnctl {

enum Math { MATH_MMA16 = 0, MATH_TF32 = 1, MATH_SIMT = 2 };

template <int X>
struct Log2 {
  static constexpr int value = 1 + Log2<X / 2>::value;
};
template <>
struct Log2<1> {
  static constexpr int value = 0;
};

// ROWS x COLS elements of T; byte offset of (r, c) with the chunk index XOR-swizzled by the
// row so that any 8 consecutive rows at one chunk column hit 8 different bank groups.
template <typename T, int ROWS, int COLS>
struct SmemTile {
  static constexpr int EB = sizeof(T);
  static constexpr int W = COLS * EB;  // bytes per row
  static_assert(W % 16 == 0, "tile rows must be whole 16-byte chunks");
  static constexpr int NC = W / 16;
  static_assert((NC & (NC - 1)) == 0, "chunks per row must be a power of two");
  static constexpr int S = NC < 8 ? NC : 8;
  static constexpr int SHIFT = 3 - Log2<S>::value;
  static constexpr int BYTES = ROWS * W;

  __device__ __forceinline__ static int offset(int r, int c) {
    const int cb = c * EB;
    const int phys = (cb >> 4) ^ ((r >> SHIFT) & (S - 1));
    return r * W + (phys << 4) + (cb & 15);
  }
};

// OVERLAP: the mma policies run gemm_mainloop_overlapped (fragment loads double-buffered
// across k steps and k-tiles) instead of gemm_mainloop; it needs more registers.
template <typename T_, int MATH_, int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_,
          bool A_KMAJOR_, bool B_KMAJOR_, bool OVERLAP_ = false>
struct GemmCfg {
  typedef T_ T;  // element type in shared memory (and of the inputs)
  static constexpr int MATH = MATH_, BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int STAGES = STAGES_;
  static constexpr bool OVERLAP = OVERLAP_ && MATH_ != 2;
  static constexpr bool A_KMAJOR = A_KMAJOR_, B_KMAJOR = B_KMAJOR_;
  static constexpr int NT = WM * WN * 32;
  static constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  static_assert(BM % WM == 0 && BN % WN == 0, "warps must tile the block");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  typedef SmemTile<T, A_KMAJOR ? BM : BK, A_KMAJOR ? BK : BM> TileA;
  typedef SmemTile<T, B_KMAJOR ? BN : BK, B_KMAJOR ? BK : BN> TileB;
  static constexpr int STAGE_BYTES = TileA::BYTES + TileB::BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;

  // byte offsets of A(m, k) and B(k, n) inside one stage's tiles
  __device__ __forceinline__ static int a_off(int m, int k) {
    return A_KMAJOR ? TileA::offset(m, k) : TileA::offset(k, m);
  }
  __device__ __forceinline__ static int b_off(int k, int n) {
    return B_KMAJOR ? TileB::offset(n, k) : TileB::offset(k, n);
  }
};

// Copy VEC elements global -> shared (async when the piece is >= 4 bytes, else through a
// register); zero when !ok.
template <typename T, int VEC>
__device__ __forceinline__ void copy_piece(unsigned char* dst, const T* src, bool ok) {
  constexpr int BYTES = VEC * (int)sizeof(T);
  static_assert(BYTES <= 16, "a piece is at most 16 bytes");
  if constexpr (BYTES >= 4) {
    cp_async<BYTES>(dst, src, ok);
  } else {
    sts<T>(dst, ok ? ldg(src) : from_float<T>(0.f));
  }
}

// Loaders: load(dst, kt) fills one stage with k-tile kt of the block's range. The mainloop
// calls it for kt = 0, 1, 2, ... in order, so a loader may carry state from one k-tile to
// the next (the convolution gathers step their (c, r, s) position instead of dividing).

// A strided row-major matrix seen through the tile: KMAJOR means the reduction index is the
// contiguous one (tile rows = M or N, tile cols = K), else tile rows = K. VEC divides the
// leading dimension and the base is VEC-element aligned, so a piece is all in or all out.
// Tile places (tile row, tile col) in shared memory (the swizzled SmemTile by default; the
// wgmma kernels pass their canonical layouts, dnnctl/wgmma_core.cuh).
template <class C, int ROWS, int COLS, int VEC, bool KMAJOR,
          class Tile_ = SmemTile<typename C::T, ROWS, COLS>>
struct MatLoader {
  typedef typename C::T T;
  typedef Tile_ Tile;
  static constexpr int CPR = COLS / VEC;  // pieces per tile row
  static constexpr int PIECES = ROWS * CPR;
  static constexpr int ITERS = (PIECES + C::NT - 1) / C::NT;
  static_assert(COLS % VEC == 0, "a piece never straddles a tile row");
  const T* base;  // this batch's matrix
  long long ld;
  int mn0;     // first m (A) or n (B) of the block's tile
  int mn_lim;  // M or N
  int k_begin, k_end;

  __device__ __forceinline__ void init(const T* base_, long long ld_, int mn0_, int mn_lim_,
                                       int k_begin_, int k_end_) {
    base = base_;
    ld = ld_;
    mn0 = mn0_;
    mn_lim = mn_lim_;
    k_begin = k_begin_;
    k_end = k_end_;
  }

  __device__ __forceinline__ bool piece(int kt, int it, int& tr, int& tc, const T*& src) const {
    const int k0 = k_begin + kt * (KMAJOR ? COLS : ROWS);
    const int p = (int)threadIdx.x + it * C::NT;
    tr = p / CPR;
    tc = (p % CPR) * VEC;
    const int r = KMAJOR ? mn0 + tr : k0 + tr;
    const int c = KMAJOR ? k0 + tc : mn0 + tc;
    const bool ok = KMAJOR ? (r < mn_lim && c < k_end) : (r < k_end && c < mn_lim);
    src = ok ? base + (long long)r * ld + c : base;
    return ok;
  }

  __device__ __forceinline__ void load(unsigned char* dst, int kt) const {
    if constexpr (VEC * (int)sizeof(T) >= 4) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        if (PIECES % C::NT != 0 && (int)threadIdx.x + it * C::NT >= PIECES) break;
        int tr, tc;
        const T* src;
        const bool ok = piece(kt, it, tr, tc, src);
        copy_piece<T, VEC>(dst + Tile::offset(tr, tc), src, ok);
      }
    } else {
      // single 16-bit elements (no cp.async below 4 bytes): in groups of up to 8, every
      // load is issued before the group's first shared store, so they overlap instead of
      // each waiting behind the previous store (a generic-pointer load may alias shared
      // memory, the compiler keeps that order); groups bound the registers held
      static_assert(VEC == 1, "pieces under 4 bytes are single elements");
      constexpr int G = ITERS < 8 ? ITERS : 8;
#pragma unroll
      for (int it0 = 0; it0 < ITERS; it0 += G) {
        T v[G];
        int off[G];
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const int it = it0 + j;
          off[j] = -1;
          if (it >= ITERS || (PIECES % C::NT != 0 && (int)threadIdx.x + it * C::NT >= PIECES))
            continue;
          int tr, tc;
          const T* src;
          const bool ok = piece(kt, it, tr, tc, src);
          v[j] = ok ? ldg(src) : from_float<T>(0.f);
          off[j] = Tile::offset(tr, tc);
        }
#pragma unroll
        for (int j = 0; j < G; ++j)
          if (off[j] >= 0) sts<T>(dst + off[j], v[j]);
      }
    }
  }
};

// The matmul operands through Cfg C's tiles: A (M x K) and B (K x N), strided matrices stored
// K-contiguous where C::A_KMAJOR / C::B_KMAJOR, VEC elements per load.
template <class C, int VEC>
using MatLoaderA = MatLoader<C, C::A_KMAJOR ? C::BM : C::BK, C::A_KMAJOR ? C::BK : C::BM, VEC,
                             C::A_KMAJOR, typename C::TileA>;
template <class C, int VEC>
using MatLoaderB = MatLoader<C, C::B_KMAJOR ? C::BN : C::BK, C::B_KMAJOR ? C::BK : C::BN, VEC,
                             C::B_KMAJOR, typename C::TileB>;

// ----------------------------------------------------------------------------- math

// Zeroes an accumulator array of any rank.
__device__ __forceinline__ void fill_zero(float& a) { a = 0.f; }
template <class T, int N>
__device__ __forceinline__ void fill_zero(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fill_zero(a[i]);
}

// The tensor-core policies, MATH_MMA16 (fp16 / bf16, mma.sync m16n8k16, fragments by
// ldmatrix, .trans for operands whose contiguous index is M or N) and MATH_TF32 (fp32 data,
// m16n8k8 on tf32-rounded values, fragments read element by element). Accumulators: per warp
// (WTM/16) x (WTN/8) tiles of 16 x 8; element (mt, nt, v) is row g (+8 for v >= 2), column
// 2t + (v & 1), with g = lane / 4, t = lane % 4.
//
// A k-tile is split into KSTEP-deep steps: load(frag, stage, kk) reads one step's fragments
// from shared memory, mma(frag) issues its tensor-core ops, so the pipelined mainloop can
// load step kk + 1 (or the next k-tile's first step) while step kk computes.
template <class C, int MATH>
struct GemmMath {
  static_assert(MATH == MATH_MMA16 || MATH == MATH_TF32, "the mma policies");
  static constexpr int MT = C::WTM / 16, NT8 = C::WTN / 8;
  static constexpr int KSTEP = MATH == MATH_MMA16 ? 16 : 8;
  static_assert(C::WTM % 16 == 0 && C::WTN % 16 == 0, "mma warp tiles are multiples of 16");
  static_assert(C::BK % KSTEP == 0, "BK is a whole number of mma k steps");
  typedef typename C::T T;
  struct Frag {
    unsigned a[MT][4];
    unsigned b[NT8][2];
  };
  float acc[MT][NT8][4];

  __device__ __forceinline__ void zero() { fill_zero(acc); }

  __device__ __forceinline__ static void load(Frag& f, const unsigned char* sA,
                                              const unsigned char* sB, int kk, int wm0,
                                              int wn0, int lane) {
    if constexpr (MATH == MATH_MMA16)
      load_mma16(f, sA, sB, kk, wm0, wn0, lane);
    else
      load_tf32(f, sA, sB, kk, wm0, wn0, lane);
  }

  __device__ __forceinline__ static void load_mma16(Frag& f, const unsigned char* sA,
                                                    const unsigned char* sB, int kk, int wm0,
                                                    int wn0, int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (C::A_KMAJOR) {
        const int row = wm0 + mt * 16 + (lane & 15);
        const int col = kk + (lane >> 4) * 8;
        ldmatrix_x4(f.a[mt], sA + C::TileA::offset(row, col));
      } else {
        const int krow = kk + (lane & 7) + (lane >> 4) * 8;
        const int mcol = wm0 + mt * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(f.a[mt], sA + C::TileA::offset(krow, mcol));
      }
    }
#pragma unroll
    for (int np = 0; np < NT8 / 2; ++np) {
      unsigned r[4];
      if (C::B_KMAJOR) {
        const int nrow = wn0 + np * 16 + (lane & 7) + (lane >> 4) * 8;
        const int kcol = kk + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(r, sB + C::TileB::offset(nrow, kcol));
      } else {
        const int krow = kk + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int ncol = wn0 + np * 16 + (lane >> 4) * 8;
        ldmatrix_x4_trans(r, sB + C::TileB::offset(krow, ncol));
      }
      f.b[2 * np][0] = r[0];
      f.b[2 * np][1] = r[1];
      f.b[2 * np + 1][0] = r[2];
      f.b[2 * np + 1][1] = r[3];
    }
  }

  __device__ __forceinline__ static void load_tf32(Frag& f, const unsigned char* sA,
                                                   const unsigned char* sB, int kk, int wm0,
                                                   int wn0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = wm0 + mt * 16 + g, k = kk + t;
      f.a[mt][0] = to_tf32(lds<float>(sA + C::a_off(m, k)));
      f.a[mt][1] = to_tf32(lds<float>(sA + C::a_off(m + 8, k)));
      f.a[mt][2] = to_tf32(lds<float>(sA + C::a_off(m, k + 4)));
      f.a[mt][3] = to_tf32(lds<float>(sA + C::a_off(m + 8, k + 4)));
    }
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt) {
      const int n = wn0 + nt * 8 + g, k = kk + t;
      f.b[nt][0] = to_tf32(lds<float>(sB + C::b_off(k, n)));
      f.b[nt][1] = to_tf32(lds<float>(sB + C::b_off(k + 4, n)));
    }
  }

  __device__ __forceinline__ void mma(const Frag& f) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        if constexpr (MATH == MATH_MMA16)
          mma_16816<T>(acc[mt][nt], f.a[mt], f.b[nt]);
        else
          mma_1688_tf32(acc[mt][nt], f.a[mt], f.b[nt]);
      }
  }

  template <class E>
  __device__ __forceinline__ void epilogue(const E& e, int row0, int col0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        const int r = row0 + mt * 16 + g, c = col0 + nt * 8 + 2 * t;
        e.store2(r, c, acc[mt][nt][0], acc[mt][nt][1]);
        e.store2(r + 8, c, acc[mt][nt][2], acc[mt][nt][3]);
      }
  }
};

// fp32 FFMA: lanes as 4 (m) x 8 (n); lane (lm, ln) owns rows lm + 4i and cols ln + 8j of
// the warp tile, so one k step reads TM + TN shared values for TM * TN FMAs.
template <class C>
struct GemmMath<C, MATH_SIMT> {
  static constexpr int TM = C::WTM / 4, TN = C::WTN / 8;
  static_assert(C::WTM % 4 == 0 && C::WTN % 8 == 0, "simt warp tiles are 4i x 8j");
  float acc[TM][TN];

  __device__ __forceinline__ void zero() { fill_zero(acc); }

  __device__ __forceinline__ void compute(const unsigned char* sA, const unsigned char* sB,
                                          int wm0, int wn0, int lane) {
    const int lm = lane >> 3, ln = lane & 7;
#pragma unroll
    for (int k = 0; k < C::BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = lds<float>(sA + C::a_off(wm0 + lm + 4 * i, k));
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = lds<float>(sB + C::b_off(k, wn0 + ln + 8 * j));
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }

  template <class E>
  __device__ __forceinline__ void epilogue(const E& e, int row0, int col0, int lane) const {
    const int lm = lane >> 3, ln = lane & 7;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int r = row0 + lm + 4 * i, c = col0 + ln + 8 * j;
        if (r < e.m && c < e.n) e.store1(r, c, acc[i][j]);
      }
  }
};

// ----------------------------------------------------------------------------- mainloop

template <class C, class M, class LA, class LB>
__device__ __forceinline__ void gemm_mainloop(M& math, LA& la, LB& lb,
                                              unsigned char* smem, int ktiles, int wm0,
                                              int wn0, int lane) {
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < ktiles) {
      la.load(smem + s * C::STAGE_BYTES, s);
      lb.load(smem + s * C::STAGE_BYTES + C::TileA::BYTES, s);
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    block_sync();
    const int nk = kt + C::STAGES - 1;
    if (nk < ktiles) {
      unsigned char* st = smem + (nk % C::STAGES) * C::STAGE_BYTES;
      la.load(st, nk);
      lb.load(st + C::TileA::BYTES, nk);
    }
    cp_async_commit();
    const unsigned char* cur = smem + (kt % C::STAGES) * C::STAGE_BYTES;
    if constexpr (C::MATH == MATH_SIMT) {
      math.compute(cur, cur + C::TileA::BYTES, wm0, wn0, lane);
    } else {
#pragma unroll
      for (int kk = 0; kk < C::BK; kk += M::KSTEP) {
        typename M::Frag f;
        M::load(f, cur, cur + C::TileA::BYTES, kk, wm0, wn0, lane);
        math.mma(f);
      }
    }
  }
  cp_async_wait<0>();
}

// The same pipeline for the mma policies, with the fragment loads overlapped (as CUTLASS's
// multistage kernels do): step kk's mma run while step kk + 1's fragments load, and the
// last step of a k-tile waits for the next k-tile, syncs, and loads its first fragments
// before issuing its own mma, so tensor cores stay busy across the barrier. The copy of
// k-tile kt + STAGES - 1 is issued at the start of k-tile kt, into the buffer every warp
// left at the previous k-tile's barrier.
template <class C, class M, class LA, class LB>
__device__ __forceinline__ void gemm_mainloop_overlapped(M& math, LA& la, LB& lb,
                                                         unsigned char* smem, int ktiles,
                                                         int wm0, int wn0, int lane) {
  constexpr int KK = C::BK / M::KSTEP;
  static_assert(KK % 2 == 0, "fragment double buffering needs an even number of k steps");
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < ktiles) {
      la.load(smem + s * C::STAGE_BYTES, s);
      lb.load(smem + s * C::STAGE_BYTES + C::TileA::BYTES, s);
    }
    cp_async_commit();
  }
  if (ktiles > 0) {
    cp_async_wait<C::STAGES - 2>();
    block_sync();
    typename M::Frag f[2];
    M::load(f[0], smem, smem + C::TileA::BYTES, 0, wm0, wn0, lane);
    for (int kt = 0; kt < ktiles; ++kt) {
      const unsigned char* cur = smem + (kt % C::STAGES) * C::STAGE_BYTES;
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        if (kk == 0) {
          const int nk = kt + C::STAGES - 1;
          if (nk < ktiles) {
            unsigned char* st = smem + (nk % C::STAGES) * C::STAGE_BYTES;
            la.load(st, nk);
            lb.load(st + C::TileA::BYTES, nk);
          }
          cp_async_commit();
        }
        if (kk == KK - 1) {
          if (kt + 1 < ktiles) {
            cp_async_wait<C::STAGES - 2>();
            block_sync();
            const unsigned char* nxt = smem + ((kt + 1) % C::STAGES) * C::STAGE_BYTES;
            M::load(f[(kk + 1) % 2], nxt, nxt + C::TileA::BYTES, 0, wm0, wn0, lane);
          }
        } else {
          M::load(f[(kk + 1) % 2], cur, cur + C::TileA::BYTES, (kk + 1) * M::KSTEP, wm0,
                  wn0, lane);
        }
        math.mma(f[kk % 2]);
      }
    }
  }
  cp_async_wait<0>();
}

template <class C, class M, class LA, class LB>
__device__ __forceinline__ void run_mainloop(M& math, LA& la, LB& lb, unsigned char* smem,
                                             int ktiles, int wm0, int wn0, int lane) {
  if constexpr (C::OVERLAP) {
    gemm_mainloop_overlapped<C>(math, la, lb, smem, ktiles, wm0, wn0, lane);
  } else {
    gemm_mainloop<C>(math, la, lb, smem, ktiles, wm0, wn0, lane);
  }
}

// One block's whole job: zero the accumulators, run the pipelined k loop over ktiles,
// hand the accumulators to the epilogue at the block tile's origin (row0, col0).
template <class C, class LA, class LB, class E>
__device__ __forceinline__ void gemm_block(LA& la, LB& lb, const E& e,
                                           unsigned char* smem, int ktiles, int row0, int col0) {
  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int wm0 = (warp / C::WN) * C::WTM, wn0 = (warp % C::WN) * C::WTN;
  GemmMath<C, C::MATH> math;
  math.zero();
  run_mainloop<C>(math, la, lb, smem, ktiles, wm0, wn0, lane);
  math.epilogue(e, row0 + wm0, col0 + wn0, lane);
}

// Split-K with the reduction fused into the GEMM kernel: every split has stored its fp32
// partial tile (slab s at ws + s * slab); the last split to finish the tile (a device-scope
// counter, reset by that split for the next launch) sums the slabs in split order, so the
// result is deterministic, and runs the store epilogue. Counters start at zero.
template <class C, class E>
__device__ __forceinline__ void splitk_fused_finish(const E& e, const float* ws,
                                                    long long slab, long long slab0, int splits,
                                                    int* counter, unsigned char* smem, int row0,
                                                    int col0) {
  fence_device();  // this thread's partial stores before the count
  block_sync();    // (also: every warp is done with the pipeline's shared memory)
  if (threadIdx.x == 0) {
    const int last = atomic_inc(counter) == splits - 1;
    if (last) *counter = 0;
    sts<int>(smem, last);
  }
  block_sync();
  if (!lds<int>(smem)) return;
  fence_device();
  // U column pairs per thread and pass, every slab's loads for all of them issued before the
  // adds: one block reads splits x BM x BN floats here, so loads in flight set its speed.
  // Each element is still 0 + slab 0 + slab 1 + ... in order (bitwise equal to the
  // separate finish kernel).
  constexpr int HALF = C::BN / 2, PAIRS = C::BM * HALF, U = 4;
  for (int i0 = (int)threadIdx.x; i0 < PAIRS; i0 += C::NT * U) {
    long long off[U];
    int row[U], col[U];
    bool in[U], two[U];
    float v0[U], v1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * C::NT;
      row[u] = row0 + i / HALF;
      col[u] = col0 + (i % HALF) * 2;
      in[u] = i < PAIRS && row[u] < e.m && col[u] < e.n;
      two[u] = in[u] && col[u] + 1 < e.n;
      off[u] = slab0 + (long long)row[u] * e.n + col[u];
      v0[u] = 0.f;
      v1[u] = 0.f;
    }
    for (int s = 0; s < splits; ++s) {
      float a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        a[u] = in[u] ? ldcg(ws + off[u] + s * slab) : 0.f;
        b[u] = two[u] ? ldcg(ws + off[u] + s * slab + 1) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        v0[u] += a[u];
        v1[u] += b[u];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (in[u]) e.store2(row[u], col[u], v0[u], v1[u]);
  }
}

}  // namespace dnnctl
