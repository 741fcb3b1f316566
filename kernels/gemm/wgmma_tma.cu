// dnnctl Hopper GEMM with TMA loads (sm_90a): C[b] = act(A[b] * B[b] + bias) (+ residual),
// fp16 / bf16 in and out, fp32 accumulation on wgmma.mma_async.
//
// Warp-specialized and persistent: warpgroup 0 is the producer, warpgroups 1..CONS the
// consumers; the grid (at most one block per SM) walks the output tiles tile = blockIdx.x,
// + gridDim.x, ... (grouped 8 tiles along M for L2 reuse), so one tile's epilogue overlaps
// the next tile's loads.
//
//   producer (one thread): for each (tile, k-tile) in order, stage s = it % STAGES, round
//     r = it / STAGES: wait empty[s] (parity (r & 1) ^ 1: the first round passes at once),
//     arrive.expect_tx(full[s], the stage's bytes), issue the TMA copies of the A and B
//     boxes into stage s completing on full[s]. Boxes outside the matrix are zero-filled
//     by the copy engine and still count their full bytes.
//   consumer warpgroup c: for each k-tile: wait full[s] (parity r & 1), wgmma the stage
//     (rows c * BM / CONS .. of the tile), commit, wait until one group is pending (the
//     previous k-tile's products are done), then each warp arrives once on empty[] of the
//     previous stage; after the last k-tile it waits for all and releases that stage too.
//   epilogue (per consumer warpgroup): 64 x 32 fp32 chunks of the accumulators go through a
//     padded shared-memory buffer (its own, so the producer keeps loading), then each thread
//     finishes 8 consecutive columns (+ bias, activation, + residual) and stores them with one
//     16-byte store where the row is aligned, element by element at the matrix edges.
//
// TMA writes shared memory through the async proxy and wgmma reads it through the async
// proxy: the mbarrier completion orders them (no proxy fence). The 128-byte swizzle of the
// copy engine (16-byte chunk j of a 128-byte row r stored at chunk j ^ (r % 8), on 1024-byte
// aligned atoms) is the layout of dnnctl/wgmma_core.cuh's WgTileK (K-major: one box of
// 64 k x ROWS) and WgTileMN (MN-major: ROWS / 64 boxes of 64 mn x 64 k, 8 KB apart).
//
// Defines: DNNCTL_DTYPE 1|2; GEMM_BM (64, 128, 256), GEMM_BN (64, 128, 256); GEMM_CONS 1|2
// consumer warpgroups; GEMM_STAGES; GEMM_A_KMAJOR, GEMM_B_KMAJOR; EPI_ACT, EPI_BIAS (0 | 1:
// per column), EPI_RES (0 | 1). Tensor maps (3-d: inner, outer, batch) come from
// dnnctl/backends/tma.py: A K-major {K, M, batch} box {64, BM}; A MN-major {M, K, batch}
// box {64, 64}; B likewise with N.
#include <dnnctl/tma.cuh>
#include <dnnctl/wgmma_core.cuh>
#include <dnnctl/gemm_macros.cuh>  // after wgmma_core.cuh: the wgmma tile defaults

using namespace dnnctl;

#ifndef GEMM_CONS
#define GEMM_CONS 2
#endif

#if DNNCTL_DTYPE == 0
#error "wgmma_tma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

typedef WgCfg<elem_t, GEMM_BM, GEMM_BN, GEMM_CONS, GEMM_STAGES, GEMM_A_KMAJOR != 0,
              GEMM_B_KMAJOR != 0>
    Cfg;

constexpr int NT = 128 * (GEMM_CONS + 1);              // producer + consumer warpgroups
constexpr int ROWS_PER_CONS = GEMM_BM / GEMM_CONS;     // tile rows per consumer
constexpr int CH_COLS = 32, CH_PAD = 40;               // staging chunk: 64 x 32 fp32, rows padded
constexpr int STAGE_TX = Cfg::STAGE_BYTES;             // bytes the TMA copies per stage
constexpr int STAGING_BYTES = 64 * CH_PAD * 4;         // per consumer warpgroup
constexpr int BAR_OFFSET = GEMM_STAGES * Cfg::STAGE_BYTES + GEMM_CONS * STAGING_BYTES;
static_assert(GEMM_BN % CH_COLS == 0, "BN is a multiple of the 32-column staging chunk");
static_assert(GEMM_A_KMAJOR || GEMM_BM % 64 == 0, "MN-major A comes in 64-wide boxes");
static_assert(GEMM_B_KMAJOR || GEMM_BN % 64 == 0, "MN-major B comes in 64-wide boxes");

namespace {

__device__ __forceinline__ void tile_of(int t, int tiles_m, int tiles_n, int& bz, int& tm,
                                        int& tn) {
  const int per = tiles_m * tiles_n;
  bz = t / per;
  tile_coords(t - bz * per, tiles_m, tiles_n, tm, tn);
}

// A position in the ring of stages: the stage and the mbarrier phase of this round of the
// ring (it flips each time the ring wraps).
struct Ring {
  int stage = 0;
  unsigned phase = 0;

  __device__ __forceinline__ void next() {
    if (++stage == GEMM_STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// One operand's boxes of k-tile k0 / 64 into dst: one K-major box {64 k, ROWS}, or ROWS / 64
// MN-major boxes {64 mn, 64 k}, 8 KB apart; mn0 is the tile's first row (m or n).
template <bool KMAJOR, int ROWS>
__device__ __forceinline__ void produce_operand(unsigned dst, const TmaMap* map, int mn0, int k0,
                                                int bz, unsigned bar) {
  if (KMAJOR) {
    tma_load_3d(dst, map, k0, mn0, bz, bar);
  } else {
#pragma unroll
    for (int j = 0; j < ROWS / 64; ++j) tma_load_3d(dst + j * 8192, map, mn0 + 64 * j, k0, bz, bar);
  }
}

// The A and B boxes of k-tile kt of tile (bz, tm, tn) into one stage.
__device__ __forceinline__ void produce(const TmaMap* ta, const TmaMap* tb, unsigned st,
                                        unsigned bar, int bz, int tm, int tn, int kt) {
  const int k0 = kt * WG_BK;
  produce_operand<GEMM_A_KMAJOR != 0, GEMM_BM>(st, ta, tm * GEMM_BM, k0, bz, bar);
  produce_operand<GEMM_B_KMAJOR != 0, GEMM_BN>(st + Cfg::TileA::BYTES, tb, tn * GEMM_BN, k0, bz,
                                               bar);
}

// y = act(v + bias) + residual for 8 consecutive columns of one row, stored.
__device__ __forceinline__ void finish8(const float* v, elem_t* c, const elem_t* bias,
                                        const elem_t* res, int row, int col, int N,
                                        long long ldc, bool vec) {
  const long long idx = (long long)row * ldc + col;
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float x = v[e];
    if (EPI_BIAS) x += (col + e < N) ? to_float(ldg(bias + col + e)) : 0.f;
    y[e] = activate<EPI_ACT>(x);
  }
  if (vec) {
    if (EPI_RES) {
      const uint4 r = ldg(reinterpret_cast<const uint4*>(res + idx));
      const elem_t* re = reinterpret_cast<const elem_t*>(&r);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] += to_float(re[e]);
    }
    uint4 out;
    out.x = pack2(from_float<elem_t>(y[0]), from_float<elem_t>(y[1]));
    out.y = pack2(from_float<elem_t>(y[2]), from_float<elem_t>(y[3]));
    out.z = pack2(from_float<elem_t>(y[4]), from_float<elem_t>(y[5]));
    out.w = pack2(from_float<elem_t>(y[6]), from_float<elem_t>(y[7]));
    stg(reinterpret_cast<uint4*>(c + idx), out);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (col + e < N) {
        float x = y[e];
        if (EPI_RES) x += to_float(ldg(res + idx + e));
        stg(c + idx + e, from_float<elem_t>(x));
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, 1)
    gemm_tma_kernel(const __grid_constant__ TmaMap tmA, const __grid_constant__ TmaMap tmB,
                    elem_t* C, const elem_t* bias, const elem_t* res, int M, int N, int K,
                    long long ldc, long long sC, long long s_bias, int batch) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  unsigned char* smem = wg_align_smem(smem_raw);
  const unsigned s0 = smem_u32(smem);
  const unsigned full0 = s0 + BAR_OFFSET, empty0 = full0 + 8 * GEMM_STAGES;
  const int wg = (int)threadIdx.x >> 7;
  const int tiles_m = (M + GEMM_BM - 1) / GEMM_BM, tiles_n = (N + GEMM_BN - 1) / GEMM_BN;
  const int tiles = tiles_m * tiles_n * batch;
  const int ktiles = (K + WG_BK - 1) / WG_BK;

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < GEMM_STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 4 * GEMM_CONS);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  block_sync();

  if (wg == 0) {  // ------------------------------------------------------------ producer
#if GEMM_CONS == 2
    setmaxnreg_dec<40>();
#endif
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tmA);
      tma_prefetch_map(&tmB);
      Ring ring;
#pragma unroll 1
      for (int t = (int)blockIdx.x; t < tiles; t += (int)gridDim.x) {
        int bz, tm, tn;
        tile_of(t, tiles_m, tiles_n, bz, tm, tn);
#pragma unroll 1
        for (int kt = 0; kt < ktiles; ++kt) {
          mbar_wait_or_trap(empty0 + 8 * ring.stage, ring.phase ^ 1u);
          const unsigned full = full0 + 8 * ring.stage;
          mbar_expect_tx(full, STAGE_TX);
          produce(&tmA, &tmB, s0 + ring.stage * Cfg::STAGE_BYTES, full, bz, tm, tn, kt);
          ring.next();
        }
      }
    }
    return;
  }

  // ------------------------------------------------------------------------- consumers
#if GEMM_CONS == 2
  setmaxnreg_inc<232>();
#endif
  const int cw = wg - 1;                       // consumer index
  const int tid = (int)threadIdx.x & 127, lane = tid & 31, warp = tid >> 5;
  float* staging = reinterpret_cast<float*>(smem + GEMM_STAGES * Cfg::STAGE_BYTES +
                                            cw * STAGING_BYTES);
  WgmmaMath<Cfg> math;
  Ring ring;
#pragma unroll 1
  for (int t = (int)blockIdx.x; t < tiles; t += (int)gridDim.x) {
    int bz, tm, tn;
    tile_of(t, tiles_m, tiles_n, bz, tm, tn);
    math.zero();
    int prev = -1;
#pragma unroll 1
    for (int kt = 0; kt < ktiles; ++kt) {
      mbar_wait(full0 + 8 * ring.stage, ring.phase);
      const unsigned st = s0 + ring.stage * Cfg::STAGE_BYTES;
      math.issue(st, st + Cfg::TileA::BYTES, cw);
      math.template wait<1>();
      if (prev >= 0) {
        warp_sync();
        if (lane == 0) mbar_arrive(empty0 + 8 * prev);
      }
      prev = ring.stage;
      ring.next();
    }
    math.template wait<0>();
    if (prev >= 0) {
      warp_sync();
      if (lane == 0) mbar_arrive(empty0 + 8 * prev);
    }

    // staged epilogue: this consumer's ROWS_PER_CONS x BN sub-tile in 64 x 32 chunks
    elem_t* c = C + bz * sC;
    const elem_t* bz_bias = EPI_BIAS ? bias + bz * s_bias : bias;
    const elem_t* bz_res = EPI_RES ? res + bz * sC : res;
    const bool rows_vec = (ldc & 7) == 0 &&
                          ((reinterpret_cast<unsigned long long>(c) & 15) == 0) &&
                          (!EPI_RES || (reinterpret_cast<unsigned long long>(bz_res) & 15) == 0);
    const int row_base = tm * GEMM_BM + cw * ROWS_PER_CONS;
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt) {
#pragma unroll
      for (int cc = 0; cc < GEMM_BN / CH_COLS; ++cc) {
        named_sync(1 + cw, 128);  // the previous chunk has been read
#pragma unroll
        for (int ii = 0; ii < CH_COLS / 8; ++ii) {
          const int i = cc * (CH_COLS / 8) + ii;
          const int r = warp * 16 + (lane >> 2), col = ii * 8 + 2 * (lane & 3);
          float2 lo, hi;
          lo.x = math.acc[mt][4 * i];
          lo.y = math.acc[mt][4 * i + 1];
          hi.x = math.acc[mt][4 * i + 2];
          hi.y = math.acc[mt][4 * i + 3];
          sts(staging + r * CH_PAD + col, lo);
          sts(staging + (r + 8) * CH_PAD + col, hi);
        }
        named_sync(1 + cw, 128);  // the chunk is staged
#pragma unroll
        for (int it = 0; it < 2; ++it) {
          const int g = tid + 128 * it;
          const int r = g >> 2, cg = g & 3;
          const int row = row_base + mt * 64 + r;
          const int col = tn * GEMM_BN + cc * CH_COLS + cg * 8;
          if (row < M && col < N) {
            const float4 a = lds<float4>(staging + r * CH_PAD + cg * 8);
            const float4 b = lds<float4>(staging + r * CH_PAD + cg * 8 + 4);
            const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            finish8(v, c, bz_bias, bz_res, row, col, N, ldc, rows_vec && col + 8 <= N);
          }
        }
      }
    }
  }
}
