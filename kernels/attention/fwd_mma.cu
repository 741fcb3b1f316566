// dnnctl attention forward on mma.sync (sm_80+), FlashAttention-2 style: one block owns BM
// rows of queries, each warp 16 or 32 of them; key / value tiles of BN rows stream through a
// cp.async double buffer; S = Q K^T and O += P V on m16n8k16 tensor cores with fp32
// accumulation; an online softmax in the log2 domain (running max and sum per row, the
// accumulator rescaled when the max grows); P is rounded to the I/O dtype and fed to the
// second product straight from the registers of the first (the m16n8 C fragment of two
// adjacent n-tiles is the m16n8k16 A fragment).
//
// Rows: without packing (ATT_PACK 0) a block's rows are queries of one query head
// (grid.y = heads_q). With ATT_PACK 1 (decode: few queries, GQA) grid.y runs over key/value
// heads and row r of a block is query r / G of query head kv_head * G + r % G, so the
// G heads of a group share each K / V tile load.
//
// Split-KV (ATT_SPLITS > 1, flash-decoding): grid.x = row blocks x splits; split s reads
// the key tiles of its slice and writes fp32 (out, lse) partials to a workspace that
// attn_combine merges.
//
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV (head dims, multiples of 16), ATT_BM (block rows),
// ATT_WM (rows per warp: 16 or 32; each K / V fragment then feeds ATT_WM / 16 m-tiles),
// ATT_BN (key tile, multiple of 16), ATT_MASK 0|1|2 (none, top_left, bottom_right),
// ATT_SOFTCAP 0|1, ATT_VARLEN 0|1, ATT_PAGED (page size, 0 = contiguous), ATT_PACK, ATT_SPLITS.
#include <dnnctl/attention_mma.cuh>

using namespace dnnctl;

#ifndef ATT_PAGED
#define ATT_PAGED 0
#endif
#ifndef ATT_PACK
#define ATT_PACK 0
#endif
#ifndef ATT_SPLITS
#define ATT_SPLITS 1
#endif
#ifndef ATT_WM
#define ATT_WM 16
#endif
constexpr int WM = ATT_WM, MT = WM / 16;  // rows per warp, m16 tiles per warp
constexpr int WARPS = BM / WM, THREADS = WARPS * 32;
static_assert(D % 16 == 0 && DV % 16 == 0 && BN % 16 == 0 && BM % WM == 0 && WM % 16 == 0,
              "tile shapes");

__device__ __forceinline__ RowMap row_of(int r, int rows, int head_base, int group) {
#if ATT_PACK
  return packed_row(r, rows, head_base, group);
#else
  (void)group;
  if (r >= rows) return {-1, 0};
  return {r, head_base};
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
attn_fwd(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
         const elem_t* __restrict__ v, elem_t* __restrict__ out, float* __restrict__ lse,
         float* __restrict__ ws_o, float* __restrict__ ws_lse, const int* __restrict__ cu_q,
         const int* __restrict__ cu_k, const int* __restrict__ block_table,
         const int* __restrict__ seqused, long long q_sb, long long q_sh, long long q_ss,
         long long k_sb, long long k_sh, long long k_ss, long long v_sb, long long v_sh,
         long long v_ss, long long o_sb, long long o_sh, long long o_ss, long long l_sb,
         long long l_sh, int seq_q, int seq_kv, int heads_q, int group, int window,
         float scale_log2, float softcap, int table_stride, int tiles_per_split) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  elem_t* Qs = reinterpret_cast<elem_t*>(smem_raw);
  elem_t* Ks = Qs + BM * QS;
  elem_t* Vs = Ks + 2 * BN * KS;

  const int b = blockIdx.z;
  const int mblk = blockIdx.x / ATT_SPLITS, split = blockIdx.x % ATT_SPLITS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#if ATT_VARLEN
  const int q0 = cu_q[b], len_q = cu_q[b + 1] - q0;
  const int k0 = cu_k[b], len_k = cu_k[b + 1] - k0;
#else
  const int q0 = 0, len_q = seq_q, k0 = 0;
#if ATT_PAGED
  const int len_k = seqused[b];
#else
  const int len_k = seq_kv;
#endif
#endif
#if ATT_PACK
  const int rows = len_q * group, head_base = blockIdx.y * group, kv_head = blockIdx.y;
#else
  const int rows = len_q, head_base = blockIdx.y, kv_head = blockIdx.y / group;
#endif
  const int m0 = mblk * BM;
  if (m0 >= rows) return;
  const int off = ATT_MASK == 1 ? 0 : len_k - len_q;  // key position of query 0

  // the key range any row of this block may read, cut to this split's slice
  const int qlo = row_of(m0, rows, head_base, group).query;
  const int qhi = row_of(min(m0 + BM, rows) - 1, rows, head_base, group).query;
  int n_begin, n_end;
  key_range<ATT_MASK>(qlo, qhi, off, len_k, window, BN, n_begin, n_end);
#if ATT_SPLITS > 1
  cut_to_split(n_begin, n_end, split, tiles_per_split);
#endif
  const int ntiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;

  const elem_t* kb = kv_base<ATT_PAGED>(k, b, kv_head, k_sb, k_sh);
  const elem_t* vb = kv_base<ATT_PAGED>(v, b, kv_head, v_sb, v_sh);
  const int* table = block_table + (ATT_PAGED ? (long long)b * table_stride : 0);
  auto key_row = [&](int j) { return kv_row<ATT_PAGED>(table, k0, j); };
  auto load_kv = [&](int t, int buf) {
    const int j0 = n_begin + t * BN;
    const int valid = min(BN, len_k - j0);
    load_tile<D, KS, BN, THREADS>(Ks + buf * BN * KS, valid,
                         [&](int r) { return kb + key_row(j0 + r) * k_ss; }, k);
    load_tile<DV, VS, BN, THREADS>(Vs + buf * BN * VS, valid,
                          [&](int r) { return vb + key_row(j0 + r) * v_ss; }, v);
  };

  // Q tile (rows gathered through the row map)
  load_tile<D, QS, BM, THREADS>(Qs, rows - m0, [&](int r) {
    const RowMap rm = row_of(m0 + r, rows, head_base, group);
    return q + (long long)b * q_sb + (long long)rm.head * q_sh + (long long)(q0 + rm.query) * q_ss;
  }, q);
  if (ntiles > 0) load_kv(0, 0);
  cp_async_commit();

  float o[MT][DV / 8][4];
  float mrow[MT][2], lrow[MT][2];
  int qpos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero_frags(o[mt]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowMap rm = row_of(m0 + warp * WM + mt * 16 + lane / 4 + 8 * h, rows, head_base, group);
      qpos[mt][h] = rm.query < 0 ? -(1 << 30) : rm.query + off;  // padding rows allow no key
      mrow[mt][h] = NEG_INF;
      lrow[mt][h] = 0.f;
    }
  }
  const int qpos_min = qlo + off;  // the block's first query: a tile at or below it is unmasked

  for (int t = 0; t < ntiles; ++t) {
    kv_tile_ready(t, ntiles, load_kv);
    const elem_t* Kt = Ks + (t & 1) * BN * KS;
    const elem_t* Vt = Vs + (t & 1) * BN * VS;

    attn_tile<MT, ATT_MASK>(o, mrow, lrow, qpos, Qs, warp * WM, Kt, Vt, n_begin + t * BN,
                            qpos_min, len_k, window, scale_log2, softcap, lane);
    block_sync();  // the next iteration's load overwrites this buffer
  }
  cp_async_wait<0>();

  // finish: full row sums, normalize, store out and lse (or the split's partials)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(lrow[mt][h]);
      const int r = m0 + warp * WM + mt * 16 + lane / 4 + 8 * h;
      const RowMap rm = row_of(r, rows, head_base, group);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float row_lse = l > 0.f ? (mrow[mt][h] + log2f(l)) * LN2 : NEG_INF;
      if (rm.query < 0) continue;
#if ATT_SPLITS > 1
      const long long idx = (((long long)split * gridDim.z + b) * heads_q + rm.head) * seq_q +
                            rm.query;
      float* wo = ws_o + idx * DV;
#pragma unroll
      for (int i = 0; i < DV / 8; ++i) {
        const int c = i * 8 + (lane % 4) * 2;
        float2 pair;
        pair.x = o[mt][i][2 * h] * inv;
        pair.y = o[mt][i][2 * h + 1] * inv;
        stg<float2>(reinterpret_cast<float2*>(wo + c), pair);
      }
      if (lane % 4 == 0) stg<float>(ws_lse + idx, row_lse);
#else
      elem_t* orow = out + (long long)b * o_sb + (long long)rm.head * o_sh +
                     (long long)(q0 + rm.query) * o_ss;
      store_frag_row<DV>(orow, o[mt], h, inv, lane);
      if (lane % 4 == 0)
        stg<float>(lse + (long long)b * l_sb + (long long)rm.head * l_sh + q0 + rm.query, row_lse);
#endif
    }
  }
}

// Merge split-KV partials: one warp per (batch, head, query) row.
extern "C" __global__ void __launch_bounds__(128)
attn_combine(const float* __restrict__ ws_o, const float* __restrict__ ws_lse,
             elem_t* __restrict__ out, float* __restrict__ lse, int batch, int heads_q,
             int seq_q, int splits, long long o_sb, long long o_sh, long long o_ss,
             long long l_sb, long long l_sh) {
  const long long row = (long long)blockIdx.x * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long long nrows = (long long)batch * heads_q * seq_q;
  if (row >= nrows) return;
  const int i = (int)(row % seq_q), h = (int)(row / seq_q % heads_q), b = (int)(row / seq_q / heads_q);
  float m = NEG_INF;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, ldg(ws_lse + s * nrows + row));
  float den = 0.f;
  if (m != NEG_INF)
    for (int s = 0; s < splits; ++s) den += exp2f((ldg(ws_lse + s * nrows + row) - m) * LOG2E);
  elem_t* orow = out + (long long)b * o_sb + (long long)h * o_sh + (long long)i * o_ss;
  for (int c = lane; c < DV; c += 32) {
    float acc = 0.f;
    if (m != NEG_INF)
      for (int s = 0; s < splits; ++s) {
        const float w = exp2f((ldg(ws_lse + s * nrows + row) - m) * LOG2E) / den;
        acc += w * ldg(ws_o + (s * nrows + row) * DV + c);
      }
    stg<elem_t>(orow + c, from_float<elem_t>(acc));
  }
  if (lane == 0)
    stg<float>(lse + (long long)b * l_sb + (long long)h * l_sh + i,
               m == NEG_INF ? NEG_INF : m + logf(den));
}
