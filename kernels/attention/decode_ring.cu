// dnnctl attention decode for Hopper (sm_90): split-KV flash-decoding with a producer warp
// that keeps a ring of key / value tiles in flight for several consumer warps.
//
// Rows: as the mma kernel's packed decode (kernels/attention/fwd_mma.cu, ATT_PACK 1), row r of
// a block is query r / G of query head kv_head * G + r % G: the G heads of a GQA group share
// each K / V tile. grid = (splits, heads_kv * row blocks, batch).
//
// Block: DEC_WARPS consumer warps and one producer warp. The producer copies key tile i (ATT_BN
// rows of K and of V in 16-byte cp.async chunks, rows padded in shared memory, so any row
// stride and a paged cache work alike) into ring stage i % STAGES; each lane's
// cp.async.mbarrier.arrive signals the stage's full barrier once its copies landed (32
// arrivals). (Measured on the H200: one cp.async.bulk per 256-byte row left the producer
// issue-bound, at 20-45 % of the copy bandwidth.) Consumer warp i % DEC_WARPS takes tile i:
// S = Q K^T and O += P V on mma.sync m16n8k16 (attn_tile, as the mma kernel), then releases
// the stage (its empty barrier). STAGES = DEC_WARPS * DEC_DEPTH, so a stage always has the
// same consumer and each barrier's parity is unambiguous. Rows past the keys copy the last
// key again (finite values, masked): every copy is full size.
//
// End: the warps' (max, sum, O) merge in shared memory; with one split the block writes out
// and lse, else fp32 partials, and the last split block of a row block to finish (a counter
// per row block, after a fence; that block resets it) merges the splits (log-sum-exp
// weighted) and writes out and lse: one launch, no combine kernel.
//
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV, ATT_BM (16 or 32 rows), ATT_BN, ATT_MASK,
// ATT_SOFTCAP, ATT_PAGED (page size, 0 = contiguous), DEC_WARPS, DEC_DEPTH. Host: q / k / v
// 16-byte aligned, row strides multiples of 8 elements; counters (one int per row block of
// the grid) zero before the first launch (each launch leaves them zero).
#include <dnnctl/attention_mma.cuh>
#include <dnnctl/tma.cuh>

using namespace dnnctl;

#ifndef ATT_PAGED
#define ATT_PAGED 0
#endif
#ifndef DEC_WARPS
#define DEC_WARPS 2
#endif
#ifndef DEC_DEPTH
#define DEC_DEPTH 2
#endif
constexpr int WARPS = DEC_WARPS, STAGES = DEC_WARPS * DEC_DEPTH, MT = BM / 16;
constexpr int THREADS = (WARPS + 1) * 32;
constexpr int STAGE_ELEMS = BN * (KS + VS);
// the end-of-block merge reuses the ring: WARPS x BM rows of DV + 2 floats
constexpr int MERGE_ELEMS = WARPS * BM * (DV + 2) * (int)(sizeof(float) / sizeof(elem_t));
constexpr int RING_ELEMS =
    STAGES * STAGE_ELEMS > MERGE_ELEMS ? STAGES * STAGE_ELEMS : MERGE_ELEMS;
static_assert(BM % 16 == 0 && MT <= 2 && D % 16 == 0 && DV % 16 == 0 && BN % 16 == 0,
              "tile shapes");

// The producer's copy of a tile: shared rows r < BN (W elements, S apart) from rows
// row_of(r) of `src` (`rs` elements apart), in 16-byte cp.async chunks, lane-strided.
template <int W, int S, class RowOf>
__device__ __forceinline__ void ring_copy(elem_t* dst, const elem_t* src, long long rs,
                                          RowOf&& row_of, int lane) {
  constexpr int CH = W / 8;  // chunks per row
  for (int c = lane; c < BN * CH; c += 32) {
    const int r = c / CH, col = (c % CH) * 8;
    cp_async<16>(dst + r * S + col, src + row_of(r) * rs + col, true);
  }
}

// The same for BN consecutive rows from `src`: where a warp-wide step covers whole rows, a
// lane keeps one column and steps its source and destination by pointer increments
// (measured on the H200: 3-10 % faster at B8 x 4096 keys than an index computation per
// chunk, which kept the producer warp busy issuing).
template <int W, int S>
__device__ __forceinline__ void ring_copy_rows(elem_t* dst, const elem_t* src, long long rs,
                                               int lane) {
  constexpr int CH = W / 8;
  if constexpr (32 % CH == 0) {
    constexpr int RPI = 32 / CH;  // rows per warp-wide step
    const int r0 = lane / CH, col = (lane % CH) * 8;
    const elem_t* g = src + r0 * rs + col;
    elem_t* d = dst + r0 * S + col;
    const long long step = RPI * rs;
#pragma unroll 8
    for (int r = r0; r < BN; r += RPI, g += step, d += RPI * S) cp_async<16>(d, g, true);
  } else {
    ring_copy<W, S>(dst, src, rs, [](int r) { return (long long)r; }, lane);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
attn_decode_ring(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
                 const elem_t* __restrict__ v, elem_t* __restrict__ out,
                 float* __restrict__ lse, float* __restrict__ ws_o, float* __restrict__ ws_lse,
                 int* __restrict__ counters, const int* __restrict__ block_table,
                 const int* __restrict__ seqused, long long q_sb, long long q_sh,
                 long long q_ss, long long k_sb, long long k_sh, long long k_ss, long long v_sb,
                 long long v_sh, long long v_ss, long long o_sb, long long o_sh, long long o_ss,
                 long long l_sb, long long l_sh, int seq_q, int seq_kv, int heads_q, int group,
                 int window, float scale_log2, float softcap, int table_stride,
                 int tiles_per_split) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  __shared__ int last_flag;
  elem_t* Qs = reinterpret_cast<elem_t*>(smem_raw);
  elem_t* ring = Qs + BM * QS;
  const unsigned bars = smem_u32(ring + RING_ELEMS);  // full[s], then empty[s]
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (STAGES + s); };

  const int b = blockIdx.z, split = blockIdx.x, nsplit = gridDim.x;
  const int heads_kv = heads_q / group, mblocks = gridDim.y / heads_kv;
  const int kv_head = blockIdx.y / mblocks, mblk = blockIdx.y % mblocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int len_q = seq_q;
#if ATT_PAGED
  const int len_k = seqused[b];
#else
  const int len_k = seq_kv;
#endif
  const int rows = len_q * group, head_base = kv_head * group, m0 = mblk * BM;
  const int off = ATT_MASK == 1 ? 0 : len_k - len_q;  // key position of query 0

  // the keys any row of this block may read, cut to this split's slice
  const int qlo = packed_row(m0, rows, head_base, group).query;
  const int qhi = packed_row(min(m0 + BM, rows) - 1, rows, head_base, group).query;
  int n_begin, n_end;
  key_range<ATT_MASK>(qlo, qhi, off, len_k, window, BN, n_begin, n_end);
  cut_to_split(n_begin, n_end, split, tiles_per_split);
  const int ntiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;

  const elem_t* kb = kv_base<ATT_PAGED>(k, b, kv_head, k_sb, k_sh);
  const elem_t* vb = kv_base<ATT_PAGED>(v, b, kv_head, v_sb, v_sh);
  const int* table = block_table + (ATT_PAGED ? (long long)b * table_stride : 0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), 32);
      mbar_init(empty(s), 1);
    }
    mbar_init_fence();
  }
  if (warp < WARPS) {  // the Q tile (rows gathered through the row map; padding rows zero)
    load_tile<D, QS, BM, WARPS * 32>(Qs, rows - m0, [&](int r) {
      const RowMap rm = packed_row(m0 + r, rows, head_base, group);
      return q + (long long)b * q_sb + (long long)rm.head * q_sh + (long long)rm.query * q_ss;
    }, q);
    cp_async_commit();
    cp_async_wait<0>();
  }
  block_sync();

  if (warp == WARPS) {
    // producer: tile i into stage i % STAGES once its consumer released the stage's last use
    for (int i = 0; i < ntiles; ++i) {
      const int s = i % STAGES;
      if (i >= STAGES) mbar_wait_or_trap(empty(s), (i / STAGES - 1) & 1);
      elem_t* Kt = ring + s * STAGE_ELEMS;
      elem_t* Vt = Kt + BN * KS;
      const int j0 = n_begin + i * BN;
      if (j0 + BN <= len_k && !ATT_PAGED) {  // a whole tile of contiguous row indices
        ring_copy_rows<D, KS>(Kt, kb + (long long)j0 * k_ss, k_ss, lane);
        ring_copy_rows<DV, VS>(Vt, vb + (long long)j0 * v_ss, v_ss, lane);
      } else {
        auto src_row = [&](int r) {  // past the keys: the last key again (masked)
          return kv_row<ATT_PAGED>(table, 0, min(j0 + r, len_k - 1));
        };
        ring_copy<D, KS>(Kt, kb, k_ss, src_row, lane);
        ring_copy<DV, VS>(Vt, vb, v_ss, src_row, lane);
      }
      cp_async_mbar_arrive(full(s));  // each lane's copies: 32 arrivals fill the stage
    }
  }

  float o[MT][DV / 8][4];
  float mrow[MT][2], lrow[MT][2];
  if (warp < WARPS) {
    int qpos[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      zero_frags(o[mt]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const RowMap rm = packed_row(m0 + mt * 16 + lane / 4 + 8 * h, rows, head_base, group);
        qpos[mt][h] = rm.query < 0 ? -(1 << 30) : rm.query + off;  // padding rows: no key
        mrow[mt][h] = NEG_INF;
        lrow[mt][h] = 0.f;
      }
    }
    const int qpos_min = qlo + off;  // the block's first query: a tile at or below it is unmasked

    for (int i = warp; i < ntiles; i += WARPS) {
      const int s = i % STAGES;
      mbar_wait(full(s), (i / STAGES) & 1);
      const elem_t* Kt = ring + s * STAGE_ELEMS;
      const elem_t* Vt = Kt + BN * KS;

      attn_tile<MT, ATT_MASK>(o, mrow, lrow, qpos, Qs, 0, Kt, Vt, n_begin + i * BN, qpos_min,
                              len_k, window, scale_log2, softcap, lane);
      warp_sync();  // every lane has read the stage
      if (lane == 0) mbar_arrive(empty(s));
    }
  }
  block_sync();  // every tile consumed: the ring is free for the merge

  // the warps' partial rows in shared memory: O unnormalized, (max, sum) per row
  float* mo = reinterpret_cast<float*>(ring);   // [WARPS][BM][DV]
  float* mst = mo + WARPS * BM * DV;            // [WARPS][BM][2]
  if (warp < WARPS) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + lane / 4 + 8 * h;
        const float l = quad_sum(lrow[mt][h]);
        float* orow = mo + (warp * BM + r) * DV;
#pragma unroll
        for (int c = 0; c < DV / 8; ++c) {
          const int col = c * 8 + (lane % 4) * 2;
          orow[col] = o[mt][c][2 * h];
          orow[col + 1] = o[mt][c][2 * h + 1];
        }
        if (lane % 4 == 0) {
          mst[(warp * BM + r) * 2] = mrow[mt][h];
          mst[(warp * BM + r) * 2 + 1] = l;
        }
      }
    }
  }
  block_sync();

  // row r, column c of the block: merged over the warps, normalized
  auto merged = [&](int r, int c, float& row_lse) {
    float mx = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, mst[(w * BM + r) * 2]);
    float l = 0.f, acc = 0.f;
    if (mx != NEG_INF) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float f = exp2f(mst[(w * BM + r) * 2] - mx);
        l += f * mst[(w * BM + r) * 2 + 1];
        acc += f * mo[(w * BM + r) * DV + c];
      }
    }
    row_lse = l > 0.f ? (mx + log2f(l)) * LN2 : NEG_INF;
    return l > 0.f ? acc / l : 0.f;
  };
  const long long nrows = (long long)gridDim.z * heads_q * seq_q;
  for (int e = threadIdx.x; e < BM * DV; e += THREADS) {
    const int r = e / DV, c = e % DV;
    const RowMap rm = packed_row(m0 + r, rows, head_base, group);
    if (rm.query < 0) continue;
    float row_lse;
    const float val = merged(r, c, row_lse);
    if (nsplit == 1) {
      stg<elem_t>(out + (long long)b * o_sb + (long long)rm.head * o_sh +
                      (long long)rm.query * o_ss + c, from_float<elem_t>(val));
      if (c == 0)
        stg<float>(lse + (long long)b * l_sb + (long long)rm.head * l_sh + rm.query, row_lse);
    } else {
      const long long idx = (((long long)split * gridDim.z + b) * heads_q + rm.head) * seq_q +
                            rm.query;
      stg<float>(ws_o + idx * DV + c, val);
      if (c == 0) stg<float>(ws_lse + idx, row_lse);
    }
  }
  if (nsplit == 1) return;

  // the last split block of this row block to finish merges the splits
  fence_device();  // this block's partials are visible before the count says so
  block_sync();
  if (threadIdx.x == 0) {
    int* counter = counters + blockIdx.z * gridDim.y + blockIdx.y;
    last_flag = atomic_inc(counter) == nsplit - 1;
    if (last_flag) stg<int>(counter, 0);  // every split has counted: ready for the next launch
  }
  block_sync();
  if (!last_flag) return;
  fence_device();
  for (int e = threadIdx.x; e < BM * DV; e += THREADS) {
    const int r = e / DV, c = e % DV;
    const RowMap rm = packed_row(m0 + r, rows, head_base, group);
    if (rm.query < 0) continue;
    const long long row = ((long long)b * heads_q + rm.head) * seq_q + rm.query;
    float mx = NEG_INF;
    for (int s = 0; s < nsplit; ++s) mx = fmaxf(mx, ldcg(ws_lse + s * nrows + row));
    float den = 0.f, acc = 0.f;
    if (mx != NEG_INF) {
      for (int s = 0; s < nsplit; ++s) {
        const float f = __expf(ldcg(ws_lse + s * nrows + row) - mx);
        den += f;
        acc += f * ldcg(ws_o + (s * nrows + row) * DV + c);
      }
    }
    stg<elem_t>(out + (long long)b * o_sb + (long long)rm.head * o_sh +
                    (long long)rm.query * o_ss + c,
                from_float<elem_t>(mx != NEG_INF ? acc / den : 0.f));
    if (c == 0)
      stg<float>(lse + (long long)b * l_sb + (long long)rm.head * l_sh + rm.query,
                 mx == NEG_INF ? NEG_INF : mx + logf(den));
  }
}
