// dnnctl Hopper GEMM core (sm_90a): a block computes a BM x BN tile of C = A (M x K) * B
// (K x N) over a K range with WG consumer warpgroups of wgmma.mma_async m64nBNk16; each
// warpgroup owns BM / WG rows (MT = BM / (64 WG) m64 slices) and the whole BN.
//
// Operands reach shared memory through cp.async (16 bytes where the alignment allows, the
// loaders of gemm_core.cuh, zero-filled outside the matrix) straight into the 128-byte
// swizzled canonical layouts wgmma reads (dnnctl/wgmma.cuh has the PTX ISA references), in a
// STAGES-deep ring of 64-deep k-tiles. Schedule of k-tile kt, for every thread:
//
//   cp.async.wait_group (k-tile kt landed; STAGES - 2 k-tiles are issued ahead)
//   fence.proxy.async    (this thread's shared writes -> the async proxy wgmma reads through)
//   bar.sync             (every thread's part of kt is fenced; every warpgroup has finished
//                         the wgmma of kt - 2, see the wait below)
//   wgmma.fence; 4 k16 steps x MT wgmma on kt; commit       (tensor cores start on kt)
//   cp.async k-tile kt + STAGES - 2 into the buffer of kt - 2 (free: see the barrier)
//   wgmma.wait_group 1   (kt - 1 has finished; kt may still run under the next barrier)
//
// so the tensor cores always have the current k-tile queued while the next loads are issued.
// The epilogue (bias, activation, residual, split-K partials) is dnnctl/epilogue.cuh's, fed
// from the accumulator fragments.
#pragma once
#include <dnnctl/gemm_core.cuh>
#include <dnnctl/wgmma.cuh>

// For dnnctl/gemm_macros.cuh: the wgmma kernels' tile defaults.
#define DNNCTL_WGMMA_CORE 1

namespace dnnctl {

constexpr int WG_BK = 64;  // k per tile: one 128-byte swizzle row of 16-bit elements

template <bool C, class A, class B>
struct WgSelect {
  typedef A type;
};
template <class A, class B>
struct WgSelect<false, A, B> {
  typedef B type;
};

// K-major operand tile: ROWS (M or N) rows of 64 k (128 bytes each); the 16-byte chunk j of
// row r sits at chunk j ^ (r % 8) of that row, so 8 rows form one 1024-byte swizzle atom:
// the K-major 128B canonical layout with SBO = 1024 (next 8 rows), LBO unused (16 encodes
// the "assumed 1"). It is exactly gemm_core's SmemTile<T, ROWS, 64> for 16-bit T, so the
// conv gathers fill it unchanged. offset(r, c): r = m or n, c = k (the loaders' order).
template <typename T, int ROWS>
struct WgTileK {
  typedef SmemTile<T, ROWS, WG_BK> Base;
  static_assert(sizeof(T) == 2 && ROWS % 8 == 0, "16-bit elements, whole 8-row atoms");
  static_assert(Base::BYTES == ROWS * 128 && Base::SHIFT == 0 && Base::S == 8,
                "SmemTile must be the 128B-swizzle K-major layout");
  static constexpr int BYTES = ROWS * 128;
  static constexpr unsigned LBO = 16, SBO = 1024;

  __device__ __forceinline__ static int offset(int r, int c) { return Base::offset(r, c); }
  // operand of one wgmma: rows mn0 .. (mn0 % 8 == 0), k kk .. kk + 15 (kk % 16 == 0)
  __device__ __forceinline__ static int start(int mn0, int kk) { return mn0 * 128 + kk * 2; }
};

// MN-major operand tile: 64 k rows of MNS (M or N, a multiple of 64) contiguous elements,
// stored as MNS / 64 column blocks of 64 x 64 (8 KB); inside a block, k-row r is 128 bytes
// at r * 128 with its 16-byte chunk j at chunk j ^ (r % 8): the MN-major 128B canonical
// layout with LBO = 8192 (next 64 along MN) and SBO = 1024 (next 8 k rows).
// offset(r, c): r = k, c = m or n (the loaders' order for operands stored MN-contiguous).
template <typename T, int MNS>
struct WgTileMN {
  static_assert(sizeof(T) == 2 && MNS % 64 == 0, "16-bit elements, whole 64-wide blocks");
  static constexpr int BYTES = MNS * 128;
  static constexpr unsigned LBO = 64 * 128, SBO = 1024;

  __device__ __forceinline__ static int offset(int r, int c) {
    return (c >> 6) * (64 * 128) + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2;
  }
  __device__ __forceinline__ static int start(int mn0, int kk) {
    return (mn0 >> 6) * (64 * 128) + kk * 128;
  }
};

template <typename T_, int BM_, int BN_, int WG_, int STAGES_, bool A_KMAJOR_, bool B_KMAJOR_>
struct WgCfg {
  typedef T_ T;
  static constexpr int BM = BM_, BN = BN_, BK = WG_BK, WG = WG_, STAGES = STAGES_;
  static constexpr bool A_KMAJOR = A_KMAJOR_, B_KMAJOR = B_KMAJOR_;
  static constexpr int NT = 128 * WG;         // threads
  static constexpr int MT = BM / (64 * WG);   // m64 slices per warpgroup
  static_assert(MT >= 1 && BM == 64 * WG * MT, "BM is a multiple of 64 per warpgroup");
  static_assert(BN == 16 || BN == 32 || BN == 64 || BN == 128 || BN == 256,
                "BN is one wgmma N (16, 32, 64, 128, 256)");
  static_assert(MT * BN / 2 <= 128, "at most 128 fp32 accumulators per thread");
  static_assert(STAGES >= 3, "the wgmma pipeline keeps two k-tiles busy");
  typedef typename WgSelect<A_KMAJOR, WgTileK<T, BM>, WgTileMN<T, BM>>::type TileA;
  typedef typename WgSelect<B_KMAJOR, WgTileK<T, BN>, WgTileMN<T, BN>>::type TileB;
  static constexpr int STAGE_BYTES = TileA::BYTES + TileB::BYTES;  // a multiple of 1024
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024;   // + alignment slack
};

// The warpgroup's accumulators and its wgmma issue / wait / epilogue.
template <class C>
struct WgmmaMath {
  static constexpr int MT = C::MT, NR = C::BN / 2;
  typedef typename C::TileA TA;
  typedef typename C::TileB TB;
  float acc[MT][NR];

  __device__ __forceinline__ void zero() { fill_zero(acc); }

  __device__ __forceinline__ void fence_acc() {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NR; ++j) wg_fence_acc(acc[i][j]);
  }

  // Queue the products of one k-tile (shared addresses of its A and B tiles) as one group.
  __device__ __forceinline__ void issue(unsigned sa, unsigned sb, int wg) {
    fence_acc();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BK; kk += 16) {
      const unsigned long long db = wg_desc(sb + TB::start(0, kk), TB::LBO, TB::SBO);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const unsigned long long da =
            wg_desc(sa + TA::start((wg * MT + mt) * 64, kk), TA::LBO, TA::SBO);
        wgmma_async<C::BN, C::A_KMAJOR ? 0 : 1, C::B_KMAJOR ? 0 : 1, typename C::T>(
            acc[mt], da, db, 1);
      }
    }
    wgmma_commit();
    fence_acc();
  }

  template <int PENDING>
  __device__ __forceinline__ void wait() {
    wgmma_wait<PENDING>();
    fence_acc();
  }

  // Fragment (PTX 9.7.15.5.1.1.1): acc[mt][4 i + 2 h + j] is row 16 w + l / 4 + 8 h and
  // column 8 i + 2 (l % 4) + j of slice mt of warpgroup wg. TRANSPOSED: the block computed
  // C^T (operands swapped), so tile element (r, c) is C's (c, r), stored one by one.
  template <bool TRANSPOSED = false, class E>
  __device__ __forceinline__ void epilogue(const E& e, int row0, int col0) const {
    const int tid = (int)threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7, w = (tid >> 5) & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r = row0 + (wg * MT + mt) * 64 + w * 16 + (lane >> 2);
#pragma unroll
      for (int i = 0; i < NR / 4; ++i) {
        const int c = col0 + i * 8 + 2 * (lane & 3);
        if constexpr (TRANSPOSED) {
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const int cr = c + (v & 1), cc = r + 8 * (v >> 1);  // C's row, column
            if (cr < e.m && cc < e.n) e.store1(cr, cc, acc[mt][4 * i + v]);
          }
        } else {
          e.store2(r, c, acc[mt][4 * i], acc[mt][4 * i + 1]);
          e.store2(r + 8, c, acc[mt][4 * i + 2], acc[mt][4 * i + 3]);
        }
      }
    }
  }
};

// The pipelined k loop (schedule in the file comment). smem is 1024-byte aligned.
template <class C, class LA, class LB>
__device__ __forceinline__ void wg_mainloop(WgmmaMath<C>& math, LA& la, LB& lb,
                                            unsigned char* smem, int ktiles) {
  constexpr int AHEAD = C::STAGES - 2;  // k-tiles in flight ahead of the one computed
  const unsigned s0 = smem_u32(smem);
  const int wg = (int)threadIdx.x >> 7;
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < ktiles) {
      la.load(smem + s * C::STAGE_BYTES, s);
      lb.load(smem + s * C::STAGE_BYTES + C::TileA::BYTES, s);
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<AHEAD - 1>();
    fence_proxy_async();
    block_sync();
    const unsigned st = s0 + (unsigned)((kt % C::STAGES) * C::STAGE_BYTES);
    math.issue(st, st + C::TileA::BYTES, wg);
    const int nk = kt + AHEAD;
    if (nk < ktiles) {
      unsigned char* dst = smem + (nk % C::STAGES) * C::STAGE_BYTES;
      la.load(dst, nk);
      lb.load(dst + C::TileA::BYTES, nk);
    }
    cp_async_commit();
    math.template wait<1>();
  }
  math.template wait<0>();
  cp_async_wait<0>();
}

// One block's whole job: zero, pipelined k loop, epilogue at the tile origin (row0, col0)
// (of C^T when TRANSPOSED).
template <class C, bool TRANSPOSED = false, class LA, class LB, class E>
__device__ __forceinline__ void wg_gemm_block(LA& la, LB& lb, const E& e, unsigned char* smem,
                                              int ktiles, int row0, int col0) {
  WgmmaMath<C> math;
  math.zero();
  wg_mainloop<C>(math, la, lb, smem, ktiles);
  math.template epilogue<TRANSPOSED>(e, row0, col0);
}

}  // namespace dnnctl
