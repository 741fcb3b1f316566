// dnnctl attention backward for Hopper (sm_90a), FlashAttention-3 style: TMA loads, wgmma for
// all five products, a producer warpgroup (copies; dQ reductions) and two consumer
// warpgroups, dQ accumulated in fp32 by the copy engine's bulk reductions (not
// deterministic: the order of the adds varies).
//
//   attn_bwdw_pre   D_i = sum_d dO[i, d] O[i, d] and lse_i log2e into the stats workspace
//                   (per batch and head: s_pad floats of lse log2e, then s_pad of D; s_pad a
//                   multiple of 4, so the copy engine can read a tile's values), and each
//                   query tile's dQ accumulator block zeroed (one warp per query row)
//   attn_bwdw       one block per key tile (BN = 128 keys) of one key/value head; consumer
//                   warpgroup c owns keys c * 64 .. c * 64 + 63 and keeps dK, dV of them in
//                   registers. For every query head of the GQA group and every query tile
//                   (BM queries, stage s of the ring):
//                     S^T  = K_c Q^T                 (A: K, B: Q, both K-major, shared)
//                     dP^T = V_c dO^T                (A: V, B: dO, both K-major, shared)
//                     P^T  = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - D)
//                     dS^T -> shared (both warpgroups)
//                     dV  += P^T dO                  (A: P from registers, B: dO MN-major)
//                     named barrier (both warpgroups' dS^T written)
//                     dK  += dS^T Q                  (A: dS^T K-major, B: Q MN-major)
//                     dQ_part = dS K over the block's 128 keys (A: dS^T MN-major, B: K
//                       MN-major); consumer c takes query rows c * 64.. (BM 128) or head-dim
//                       columns c * 64.. (BM 64); the partials go to a shared dQ tile
//                       (dq_empty / dq_full) that the reducer thread adds to the fp32
//                       accumulator with one cp.reduce.async.bulk, off the consumers' path
//   attn_bwdw_post  dQ = accumulator x scale, rounded to the I/O dtype (the accumulator is
//                   tiled like the consumers' fragments: dq_tile_offset)
//
// The producer (one thread): K and V of the block once (kv_full), then per query tile it:
// wait q_empty[s] (parity ((it / ST) & 1) ^ 1), TMA Q, dO and the tile's lse / D pair into
// stage s (q_full[s]). The consumers release a stage (one arrival per warp, 8) once the
// products that read it have finished.
//
// The dS^T buffer is double-buffered: a warpgroup writes tile it's after its own dQ of it - 1
// has finished, and the other warpgroup can be at most at dQ of it - 1 (it passed the barrier
// of it - 1 only after finishing dQ of it - 2), which reads the other buffer.
//
// Registers per consumer thread: dK (DP / 2) + dV (DVP / 2) + S^T and dP^T (BM / 2 each), or
// after the softmax, P (BM / 4) + dQ (DQN / 2): 192 at head dim 128 with BM 64 and at head
// dim 64 with BM 128; the producer warpgroup gives its registers to the consumers
// (setmaxnreg 24 / 240).
//
// Shared memory (1024-byte aligned atoms, 128-byte swizzle written by the copy engine and, for
// dS^T, by the consumers with the same XOR):
//   K, V:     KC (VC) chunks of BN key rows x 64 head-dim elements;
//   Q, dO:    ST stages of KC (VC) chunks of BM query rows x 64;
//   dS^T:     2 buffers of BM / 64 column blocks of BN key rows x 64 queries (MN-major A of
//             dQ = dS K: M the queries, the reduction over keys);
//   lse, D:   ST stages of BM floats of lse log2e, then BM of D;
//   dQ:       one BM x DP fp32 tile in the accumulator's fragment order.
//
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV (multiples of 8, <= 128), ATT_BM (64 | 128),
// ATT_STAGES, ATT_MASK 0|1|2, ATT_SOFTCAP 0|1, ATT_VARLEN 0|1, ATT_LAYOUT 0|1 (as the
// forward's tensor maps: dnnctl/ops/attention/wgmma.py).
#include <dnnctl/attention_tma.cuh>
#include <dnnctl/mufu.cuh>
#include <dnnctl/wgmma.cuh>

using namespace dnnctl;

#ifndef ATT_BM
#define ATT_BM 64
#endif

#if DNNCTL_DTYPE == 0
#error "bwd_wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

constexpr int D = ATT_D, DV = ATT_DV, BM = ATT_BM, BN = 128, ST = ATT_STAGES;
constexpr int DP = D <= 64 ? 64 : 128, DVP = DV <= 64 ? 64 : 128;  // wgmma N of dK, dV
constexpr int KC = DP / 64, VC = DVP / 64;
constexpr int NT = 384;  // producer warpgroup + two consumers
constexpr int K_BYTES = KC * BN * 128, V_BYTES = VC * BN * 128;
constexpr int Q_BYTES = KC * BM * 128, O_BYTES = VC * BM * 128, DS_BYTES = BM * BN * 2;
constexpr int V_OFF = K_BYTES, Q_OFF = V_OFF + V_BYTES, O_OFF = Q_OFF + ST * Q_BYTES;
constexpr int DS_OFF = O_OFF + ST * O_BYTES, L_OFF = DS_OFF + 2 * DS_BYTES;
constexpr int L_BYTES = 2 * BM * 4, DQ_OFF = L_OFF + ST * L_BYTES;
constexpr int DQ_BYTES = BM * DP * 4, BAR_OFF = DQ_OFF + DQ_BYTES;
// dQ of one warpgroup: 64 rows x DQN columns, 32 floats per thread
constexpr int DQN = BM == 128 ? DP : DP / 2;
static_assert(D % 8 == 0 && DV % 8 == 0 && D <= 128 && DV <= 128, "head dims");
static_assert(BM == 64 || BM == 128, "query tile");
static_assert(DQN == 64, "dQ tile of a warpgroup: 64 x 64 (32 floats per thread)");
static_assert(ST >= 2, "stages");
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;

namespace {

// A sequence's rows (attn_seq) and its first rows in the BSHD maps (batch * seq, or
// cu_seqlens[b]).
struct Rows : AttnSeq {
  int qbase, kbase;
};

__device__ __forceinline__ Rows rows_of(int b, const int* cu_q, const int* cu_k, int seq_q,
                                        int seq_kv) {
  Rows r;
  static_cast<AttnSeq&>(r) = attn_seq(b, cu_q, cu_k, seq_q, seq_kv);
  r.qbase = ATT_VARLEN ? r.q0 : b * seq_q;
  r.kbase = ATT_VARLEN ? r.k0 : b * seq_kv;
  return r;
}

// Byte offset of element (key r, query c) of a dS^T buffer: column block c / 64 of BN rows,
// row r at r * 128, 16-byte chunk ((c % 64) / 8) ^ (r % 8).
__device__ __forceinline__ unsigned ds_offset(int r, int c) {
  return (unsigned)((c >> 6) * BN * 128 + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) +
                    (c & 7) * 2);
}

// The row pair of (batch b, query head h) in the stats workspace: lse log2e, then D, each
// s_pad floats (varlen: one pair per head, the sequences one after the other).
__device__ __forceinline__ int stats_row(int b, int h, int heads_q) {
#if ATT_VARLEN
  return h;
#else
  return b * heads_q + h;
#endif
}

// Position of query 0 of sequence b in its stats row. A copy's innermost coordinate must be
// a multiple of 16 bytes (the H200 raises an illegal instruction otherwise), so varlen
// sequences start at multiples of 4 floats: round_up(cu_q[b], 4) + 4 b, which keeps them
// apart (s_pad = round_up(total, 4) + 4 batch).
__device__ __forceinline__ int stats_pos(int b, int q0) {
#if ATT_VARLEN
  return ((q0 + 3) & ~3) + 4 * b;
#else
  (void)b;
  (void)q0;
  return 0;
#endif
}

// The dQ accumulator is tiled like the consumers' fragments, so their partials go to shared
// memory without bank conflicts and from there to global memory in one bulk reduction: per
// (query tile, head) BM x DP floats, float4 j (of 8) of consumer thread t (of 256) at
// (j * 256 + t) * 4. Thread t = 128 c + 32 w + l of consumer c holds rows (BM 128: 64 c +)
// 16 w + l / 4 (+ 8) and columns (BM 64: 64 c +) 8 j + 2 (l % 4) (+ 1). Query tiles of a
// sequence are numbered from b x tiles (varlen: floor(cu_q[b] / BM) + b, which leaves
// room for every sequence's partial last tile).
__device__ __forceinline__ long long dq_tile_offset(int b, int i0, int q0, int seq_q, int h,
                                                     int heads_q) {
#if ATT_VARLEN
  const int tile = q0 / BM + b + i0 / BM;
#else
  (void)q0;
  const int tile = b * ((seq_q + BM - 1) / BM) + i0 / BM;
#endif
  return ((long long)tile * heads_q + h) * (BM * DP);
}

}  // namespace

// ------------------------------------------------------------------- D_i, dQ zeroed

extern "C" __global__ void __launch_bounds__(128)
attn_bwdw_pre(const elem_t* __restrict__ o, const elem_t* __restrict__ dout,
              const float* __restrict__ lse, float* __restrict__ stats,
              float* __restrict__ dq_acc, const int* __restrict__ cu_q,
              const int* __restrict__ cu_k, long long o_sb, long long o_sh, long long o_ss,
              long long l_sb, long long l_sh, int seq_q, int seq_kv, int heads_q, int s_pad) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const Rows r = rows_of(b, cu_q, cu_k, seq_q, seq_kv);
  if (i >= r.len_q) return;
  const long long row = (long long)b * o_sb + (long long)h * o_sh + (long long)(r.q0 + i) * o_ss;
  const float acc = warp_row_dot<DV>(o, dout, row, lane);
  if (i % BM == 0) {  // the first row's warp zeroes the query tile's dQ block
    float4* blk = reinterpret_cast<float4*>(
        dq_acc + dq_tile_offset(b, i, r.q0, seq_q, h, heads_q));
    for (int k = lane; k < BM * DP / 4; k += 32) stg<float4>(blk + k, make_float4(0.f, 0.f, 0.f, 0.f));
  }
  float* st = stats + (long long)stats_row(b, h, heads_q) * 2 * s_pad + stats_pos(b, r.q0) + i;
  if (lane == 0) {
    stg<float>(st, ldg(lse + (long long)b * l_sb + (long long)h * l_sh + r.q0 + i) * LOG2E);
    stg<float>(st + s_pad, acc);
  }
#if ATT_VARLEN
  // The last row's warp zeroes the gap after the sequence (up to the next non-empty
  // sequence's start or the end of the row): a query tile running past the sequence reads
  // it, and D there multiplies a zero P (0 x NaN would poison dK).
  if (i == r.len_q - 1) {
    int bn = b + 1;
    while (bn < (int)gridDim.z && cu_q[bn + 1] == cu_q[bn]) ++bn;  // empty sequences
    const int next = bn < (int)gridDim.z ? stats_pos(bn, cu_q[bn]) : s_pad;
    for (int c = 1 + lane; stats_pos(b, r.q0) + i + c < next; c += 32) {
      stg<float>(st + c, 0.f);
      stg<float>(st + s_pad + c, 0.f);
    }
  }
#endif
}

// ------------------------------------------------------------------- dQ from fp32

extern "C" __global__ void __launch_bounds__(128)
attn_bwdw_post(const float* __restrict__ dq_acc, elem_t* __restrict__ dq,
               const int* __restrict__ cu_q, const int* __restrict__ cu_k, long long q_sb,
               long long q_sh, long long q_ss, int seq_q, int seq_kv, int heads_q,
               float scale) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const Rows r = rows_of(b, cu_q, cu_k, seq_q, seq_kv);
  if (i >= r.len_q) return;
  const int rt = i % BM;  // row in the query tile
  const float* blk = dq_acc + dq_tile_offset(b, i - rt, r.q0, seq_q, h, heads_q);
  elem_t* out = dq + (long long)b * q_sb + (long long)h * q_sh + (long long)(r.q0 + i) * q_ss;
  for (int c = 2 * lane; c < D; c += 64) {
    const int cw = BM == 128 ? rt >> 6 : c >> 6;
    const int rr = BM == 128 ? rt & 63 : rt, cc = BM == 128 ? c : c & 63;
    const int t = cw * 128 + (rr >> 4) * 32 + (rr & 7) * 4 + ((cc & 7) >> 1);
    const float2 v = ldg(reinterpret_cast<const float2*>(blk) + ((cc >> 3) * 256 + t) * 2 +
                         ((rr >> 3) & 1));
    stg<unsigned>(reinterpret_cast<unsigned*>(out + c),
                  pack2(from_float<elem_t>(v.x * scale), from_float<elem_t>(v.y * scale)));
  }
}

// ------------------------------------------------------------------- dK, dV, dQ partials

extern "C" __global__ void __launch_bounds__(NT, 1)
    attn_bwdw(const __grid_constant__ TmaMap tmQ, const __grid_constant__ TmaMap tmK,
              const __grid_constant__ TmaMap tmV, const __grid_constant__ TmaMap tmO,
              const __grid_constant__ TmaMap tmS, float* __restrict__ dq_acc,
              elem_t* __restrict__ dk, elem_t* __restrict__ dv,
              const int* __restrict__ cu_q, const int* __restrict__ cu_k, long long k_sb,
              long long k_sh, long long k_ss, long long v_sb, long long v_sh, long long v_ss,
              int seq_q, int seq_kv, int heads_q, int group,
              int window, float scale, float softcap) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  unsigned char* sm = wg_align_smem(smem_raw);
  const unsigned s0 = smem_u32(sm);
  const unsigned kv_full = s0 + BAR_OFF;
  const unsigned q_full0 = kv_full + 8, q_empty0 = q_full0 + 8 * ST;
  const unsigned dq_full = q_empty0 + 8 * ST, dq_empty = dq_full + 8;
  const float* Ls = reinterpret_cast<const float*>(sm + L_OFF);  // per stage: lse, then D

  const int b = blockIdx.z, kvh = blockIdx.y, n0 = blockIdx.x * BN;
  const int heads_kv = heads_q / group;
  const Rows rw = rows_of(b, cu_q, cu_k, seq_q, seq_kv);
  if (n0 >= rw.len_k) return;
  const int off = rw.off;  // key position of query 0

  // the queries that may see a key of this tile
  int i_begin = 0, i_end = rw.len_q;
  if (ATT_MASK != 0) i_begin = max(0, n0 - off);
  if (window > 0) {
    i_end = min(i_end, n0 + BN - 1 - off + window + 1);
    if (ATT_MASK == 0) i_begin = max(0, n0 - off - window);
  }
  i_begin = i_begin / BM * BM;
  const int ntq = i_end > i_begin ? (i_end - i_begin + BM - 1) / BM : 0;
  const int total = ntq * group;
  // iteration it: query tile it % ntq of the group's query head it / ntq
  auto head_of = [&](int it) { return kvh * group + it / ntq; };
  auto row_of = [&](int it) { return i_begin + (it % ntq) * BM; };

  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(q_full0 + 8 * s, 1);
      mbar_init(q_empty0 + 8 * s, 8);   // one arrival per consumer warp
    }
    mbar_init(dq_full, 8);
    mbar_init(dq_empty, 1);
    mbar_init_fence();
  }
  block_sync();
  const int wg = (int)threadIdx.x >> 7;

  if (wg == 0) {  // ------------------------------------------------------------ producer
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 32 && total > 0) {  // the dQ reducer: one bulk reduction per tile
#pragma unroll 1
      for (int it = 0; it < total; ++it) {
        const int h = head_of(it), i0 = row_of(it);
        mbar_wait_or_trap(dq_full, it & 1);
        bulk_reduce_add_f32(dq_acc + dq_tile_offset(b, i0, rw.q0, seq_q, h, heads_q),
                            s0 + DQ_OFF, DQ_BYTES);
        bulk_commit();
        bulk_wait_read<0>();
        mbar_arrive(dq_empty);
      }
      bulk_wait<0>();
    }
    if (threadIdx.x != 0 || total == 0) return;
    tma_prefetch_map(&tmQ);
    tma_prefetch_map(&tmK);
    tma_prefetch_map(&tmV);
    tma_prefetch_map(&tmO);
    tma_prefetch_map(&tmS);
    mbar_expect_tx(kv_full, K_BYTES + V_BYTES);
    load_rows(s0, &tmK, KC, BN * 128, n0, kvh, heads_kv, b, rw.kbase, kv_full);
    load_rows(s0 + V_OFF, &tmV, VC, BN * 128, n0, kvh, heads_kv, b, rw.kbase, kv_full);
#pragma unroll 1
    for (int it = 0; it < total; ++it) {
      const int s = it % ST, h = head_of(it), i0 = row_of(it);
      const unsigned full = q_full0 + 8 * s;
      mbar_wait_or_trap(q_empty0 + 8 * s, ((it / ST) & 1) ^ 1u);
      mbar_expect_tx(full, Q_BYTES + O_BYTES + L_BYTES);
      load_rows(s0 + Q_OFF + s * Q_BYTES, &tmQ, KC, BM * 128, i0, h, heads_q, b, rw.qbase, full);
      load_rows(s0 + O_OFF + s * O_BYTES, &tmO, VC, BM * 128, i0, h, heads_q, b, rw.qbase, full);
      tma_load_3d(s0 + L_OFF + s * L_BYTES, &tmS, stats_pos(b, rw.q0) + i0, 0,
                  stats_row(b, h, heads_q), full);
    }
    return;
  }

  // ------------------------------------------------------------------------- consumers
  setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 1;
  const int tid = (int)threadIdx.x & 127, lane = tid & 31, warp = tid >> 5;
  const int krow = cw * 64 + warp * 16 + (lane >> 2);  // block key rows krow, krow + 8
  const int key[2] = {n0 + krow, n0 + krow + 8};
#if !ATT_SOFTCAP
  const float scale_log2 = scale * LOG2E;
#endif

  float dka[DP / 2], dva[DVP / 2];
#pragma unroll
  for (int i = 0; i < DP / 2; ++i) dka[i] = 0.f;
#pragma unroll
  for (int i = 0; i < DVP / 2; ++i) dva[i] = 0.f;

  if (total > 0) mbar_wait(kv_full, 0);
#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    const int s = it % ST, h = head_of(it), i0 = row_of(it);
    const unsigned qs = s0 + Q_OFF + s * Q_BYTES, os = s0 + O_OFF + s * O_BYTES;
    const unsigned ds = s0 + DS_OFF + (it & 1) * DS_BYTES;
    mbar_wait(q_full0 + 8 * s, (it / ST) & 1);

    // S^T = K_c Q^T and dP^T = V_c dO^T, one group each
    float st[BM / 2], dpt[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) wg_fence_acc(st[i]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < KC; ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned long long da = wg_desc(s0 + c * BN * 128 + cw * 64 * 128 + kk * 32, 16, 1024);
        const unsigned long long db = wg_desc(qs + c * BM * 128 + kk * 32, 16, 1024);
        wgmma_async<BM, 0, 0, elem_t>(st, da, db, (c | kk) != 0);
      }
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) wg_fence_acc(dpt[i]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < VC; ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned long long da =
            wg_desc(s0 + V_OFF + c * BN * 128 + cw * 64 * 128 + kk * 32, 16, 1024);
        const unsigned long long db = wg_desc(os + c * BM * 128 + kk * 32, 16, 1024);
        wgmma_async<BM, 0, 0, elem_t>(dpt, da, db, (c | kk) != 0);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      wg_fence_acc(st[i]);
      wg_fence_acc(dpt[i]);
    }

    // P^T and dS^T (rows: this thread's keys, columns: the tile's queries)
    const float* lt = Ls + s * 2 * BM;
    const float* dt = lt + BM;
    const bool masked = n0 + BN > rw.len_k || i0 + BM > rw.len_q || window > 0 ||
                        (ATT_MASK != 0 && n0 + BN - 1 > i0 + off);
#pragma unroll
    for (int i = 0; i < BM / 8; ++i) {
      const int c = 8 * i + 2 * (lane & 3);
      const float2 lv = lds<float2>(lt + c), dd = lds<float2>(dt + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e >> 1, q = i0 + c + (e & 1);
        float x = st[4 * i + e], dcap = 1.f;
#if ATT_SOFTCAP
        const float th = tanhf(x * scale / softcap);
        dcap = 1.f - th * th;
        x = softcap * th * LOG2E;
#else
        x *= scale_log2;
#endif
        float p = ex2_approx(x - ((e & 1) ? lv.y : lv.x));
        if (masked && !(q < rw.len_q && key_allowed<ATT_MASK>(key[hh], q + off, rw.len_k, window)))
          p = 0.f;
        st[4 * i + e] = p;
        dpt[4 * i + e] = p * (dpt[4 * i + e] - ((e & 1) ? dd.y : dd.x)) * dcap;
      }
    }
    // dS^T into shared memory (this warpgroup's 64 key rows): the K-major A operand of
    // dK += dS^T Q and, for both warpgroups, the MN-major A operand of dQ = dS K
#pragma unroll
    for (int i = 0; i < BM / 8; ++i) {
      const int c = 8 * i + 2 * (lane & 3);
      sts<unsigned>(sm + (ds - s0) + ds_offset(krow, c),
                    pack2(from_float<elem_t>(dpt[4 * i]), from_float<elem_t>(dpt[4 * i + 1])));
      sts<unsigned>(sm + (ds - s0) + ds_offset(krow + 8, c),
                    pack2(from_float<elem_t>(dpt[4 * i + 2]), from_float<elem_t>(dpt[4 * i + 3])));
    }
    fence_proxy_async();
    unsigned pa[BM / 4];
#pragma unroll
    for (int i = 0; i < BM / 4; ++i)
      pa[i] = pack2(from_float<elem_t>(st[2 * i]), from_float<elem_t>(st[2 * i + 1]));

    // dV += P^T dO (the reduction over the tile's queries), P from registers
#pragma unroll
    for (int i = 0; i < DVP / 2; ++i) wg_fence_acc(dva[i]);
#pragma unroll
    for (int i = 0; i < BM / 4; ++i) wg_fence_reg(pa[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      const unsigned a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
      wgmma_async_rs<DVP, 1, elem_t>(dva, a, wg_desc(os + kk * 16 * 128, BM * 128, 1024), 1);
    }
    wgmma_commit();
    named_sync(1, 256);  // both warpgroups' dS^T written and fenced

    // dK += dS^T Q, dS^T from shared memory (K-major: 64 queries per 128-byte row)
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) wg_fence_acc(dka[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      const unsigned long long da =
          wg_desc(ds + (kk / 4) * BN * 128 + cw * 64 * 128 + (kk % 4) * 32, 16, 1024);
      wgmma_async<DP, 0, 1, elem_t>(dka, da, wg_desc(qs + kk * 16 * 128, BM * 128, 1024), 1);
    }
    wgmma_commit();

    // dQ part = dS K over the block's keys: rows qr0.., columns dc0..
    const int qr0 = BM == 128 ? cw * 64 : 0, dc0 = BM == 128 ? 0 : cw * 64;
    float dqa[DQN / 2];
#pragma unroll
    for (int i = 0; i < DQN / 2; ++i) wg_fence_acc(dqa[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned long long da = wg_desc(ds + (qr0 / 64) * BN * 128 + kk * 16 * 128, BN * 128, 1024);
      const unsigned long long db = wg_desc(s0 + (dc0 / 64) * BN * 128 + kk * 16 * 128, BN * 128, 1024);
      wgmma_async<DQN, 1, 1, elem_t>(dqa, da, db, kk != 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < DQN / 2; ++i) wg_fence_acc(dqa[i]);
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) wg_fence_acc(dka[i]);
#pragma unroll
    for (int i = 0; i < DVP / 2; ++i) wg_fence_acc(dva[i]);
#pragma unroll
    for (int i = 0; i < BM / 4; ++i) wg_fence_reg(pa[i]);
    warp_sync();
    if (lane == 0) mbar_arrive(q_empty0 + 8 * s);

    // the partial dQ into shared memory (float4 j of thread t at (j * 256 + t) * 16 bytes)
    // for the reducer's bulk reduction
    mbar_wait(dq_empty, (it & 1) ^ 1u);
    const int t = cw * 128 + tid;
#pragma unroll
    for (int j = 0; j < DQN / 8; ++j)
      sts<float4>(sm + DQ_OFF + (j * 256 + t) * 16,
                  make_float4(dqa[4 * j], dqa[4 * j + 1], dqa[4 * j + 2], dqa[4 * j + 3]));
    fence_proxy_async();
    warp_sync();
    if (lane == 0) mbar_arrive(dq_full);
  }

  // dK (x scale) and dV of this warpgroup's keys
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (key[hh] >= rw.len_k) continue;
    const long long kr = (long long)(rw.k0 + key[hh]);
    elem_t* dkr = dk + (long long)b * k_sb + (long long)kvh * k_sh + kr * k_ss;
    elem_t* dvr = dv + (long long)b * v_sb + (long long)kvh * v_sh + kr * v_ss;
#pragma unroll
    for (int i = 0; i < DP / 8; ++i) {
      const int c = 8 * i + 2 * (lane & 3);
      if (c < D)
        stg<unsigned>(reinterpret_cast<unsigned*>(dkr + c),
                      pack2(from_float<elem_t>(dka[4 * i + 2 * hh] * scale),
                            from_float<elem_t>(dka[4 * i + 2 * hh + 1] * scale)));
    }
#pragma unroll
    for (int i = 0; i < DVP / 8; ++i) {
      const int c = 8 * i + 2 * (lane & 3);
      if (c < DV)
        stg<unsigned>(reinterpret_cast<unsigned*>(dvr + c),
                      pack2(from_float<elem_t>(dva[4 * i + 2 * hh]),
                            from_float<elem_t>(dva[4 * i + 2 * hh + 1])));
    }
  }
}
