// The mma.sync pieces of the FlashAttention-2 style kernels (kernels/attention/fwd_mma.cu and
// bwd_mma.cu): the tile defines both take and warp-level products on m16n8k16 fragments of
// tiles staged in shared memory (rows padded by 8 elements: ldmatrix rows on distinct banks).
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV (head dims, multiples of 16), ATT_BM (query rows
// of a block), ATT_BN (key tile, a multiple of 16), and those of <dnnctl/attention.cuh>.
#pragma once
#include <dnnctl/attention.cuh>

#ifndef ATT_D
#define ATT_D 64
#endif
#ifndef ATT_DV
#define ATT_DV ATT_D
#endif
#ifndef ATT_BM
#define ATT_BM 64
#endif
#ifndef ATT_BN
#define ATT_BN 64
#endif

#if DNNCTL_DTYPE == 0
#error "the mma.sync attention kernels are fp16 / bf16 (DNNCTL_DTYPE 1 or 2)"
#endif

constexpr int D = ATT_D, DV = ATT_DV, BM = ATT_BM, BN = ATT_BN;
constexpr int QS = D + 8, KS = D + 8, VS = DV + 8;  // smem row strides (elements): +16 bytes
                                                    // keeps ldmatrix rows on distinct banks

namespace dnnctl {

// The double-buffered K / V pipeline at key tile t of ntiles: tile t + 1's copies go out
// (load_kv(t + 1, buffer)) before tile t is waited for; on return tile t is in buffer t & 1
// for the whole block.
template <class LoadKV>
__device__ __forceinline__ void kv_tile_ready(int t, int ntiles, LoadKV&& load_kv) {
  if (t + 1 < ntiles) {
    load_kv(t + 1, (t + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  block_sync();
}

// acc[mt] (16 x N in m16n8 fragments) += A_mt B^T on one warp, for MT 16-row tiles of A: A_mt
// is rows row0 + mt * 16 .. of `a` (K wide, row stride AS), B is N rows of `b` (stride BS).
template <int MT, int K, int N, int AS, int BS>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][N / 8][4], const elem_t* a, int row0,
                                        const elem_t* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(af[mt], a + (row0 + mt * 16 + (lane & 15)) * AS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      unsigned r[4];
      ldmatrix_x4(r, b + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * BS + kk * 16 +
                         ((lane >> 3) & 1) * 8);
      const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<elem_t>(acc[mt][2 * nn], af[mt], b0);
        mma_16816<elem_t>(acc[mt][2 * nn + 1], af[mt], b1);
      }
    }
  }
}

// One 16-row tile (MT = 1).
template <int K, int N, int AS, int BS>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const elem_t* a, int row0,
                                        const elem_t* b, int lane) {
  mma_abt<1, K, N, AS, BS>(reinterpret_cast<float (&)[1][N / 8][4]>(acc), a, row0, b, lane);
}

// acc[mt] (16 x N) += P_mt B over the 16 keys of slice kk: P_mt the A fragments pa[mt] (see
// pack_afrag), B rows kk * 16 .. of `b` (N wide, row stride BS), read transposed.
template <int MT, int N, int BS>
__device__ __forceinline__ void mma_pb(float (&acc)[MT][N / 8][4], const unsigned (&pa)[MT][4],
                                       const elem_t* b, int kk, int lane) {
#pragma unroll
  for (int dd = 0; dd < N / 16; ++dd) {
    unsigned r[4];
    ldmatrix_x4_trans(r, b + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * BS + dd * 16 +
                             (lane >> 4) * 8);
    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_16816<elem_t>(acc[mt][2 * dd], pa[mt], b0);
      mma_16816<elem_t>(acc[mt][2 * dd + 1], pa[mt], b1);
    }
  }
}

template <int N, int BS>
__device__ __forceinline__ void mma_pb(float (&acc)[N / 8][4], const unsigned (&pa)[4],
                                       const elem_t* b, int kk, int lane) {
  mma_pb<1, N, BS>(reinterpret_cast<float (&)[1][N / 8][4]>(acc),
                   reinterpret_cast<const unsigned (&)[1][4]>(pa), b, kk, lane);
}

// The A fragment of key slice kk from an fp32 accumulator c (16 x keys): the m16n8 C
// fragments of n-tiles 2 kk and 2 kk + 1 are one m16n8k16 A fragment, rounded to elem_t.
template <int NT>
__device__ __forceinline__ void pack_afrag(unsigned (&a)[4], const float (&c)[NT][4], int kk) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int nt = 2 * kk + half;
    a[2 * half] = pack2(from_float<elem_t>(c[nt][0]), from_float<elem_t>(c[nt][1]));
    a[2 * half + 1] = pack2(from_float<elem_t>(c[nt][2]), from_float<elem_t>(c[nt][3]));
  }
}

template <int NT>
__device__ __forceinline__ void zero_frags(float (&c)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
}

// Where a block row lives: the query (-1: a padding row) and its query head.
struct RowMap {
  int query;
  int head;
};

// Packed rows (decode, GQA): row r of `rows` is query r / group of query head
// head_base + r % group, so the group's heads share each K / V tile.
__device__ __forceinline__ RowMap packed_row(int r, int rows, int head_base, int group) {
  if (r >= rows) return {-1, 0};
  return {r / group, head_base + r % group};
}

// A block's keys [n_begin, n_end) cut to split `split` of tiles_per_split key tiles each.
__device__ __forceinline__ void cut_to_split(int& n_begin, int& n_end, int split,
                                             int tiles_per_split) {
  n_begin = max(n_begin, split * tiles_per_split * BN);
  n_end = min(n_end, (split + 1) * tiles_per_split * BN);
}

// The first row of (batch b, kv head h) in k or v: a contiguous cache's, or with PAGE > 0 a
// paged cache's head offset alone (its pages are global: the block table names them).
template <int PAGE>
__device__ __forceinline__ const elem_t* kv_base(const elem_t* x, int b, int h, long long sb,
                                                 long long sh) {
  return x + (PAGE > 0 ? 0 : (long long)b * sb) + (long long)h * sh;
}

// The cache row of key j: k0 + j, or with PAGE-token pages row j % PAGE of the page the
// sequence's block table row `table` names.
template <int PAGE>
__device__ __forceinline__ long long kv_row(const int* table, int k0, int j) {
  if constexpr (PAGE > 0) {
    return (long long)table[j / PAGE] * PAGE + j % PAGE;
  } else {
    return (long long)(k0 + j);
  }
}

// One key tile of the online softmax for a warp's MT 16-row tiles (the mma kernels' loop
// body): S = Q K^T (rows row0 .. of Q, the BN keys of K tile kt, the first key j0), scaled
// into the log2 domain (or softcapped: c tanh(s / c)), keys masked where a mask or the end
// cuts the tile (qpos: each fragment row's key position; qpos_min: the block's first query's,
// at or above which a causal tile is whole), the running row maxima `mrow` and sums `lrow`
// updated and O rescaled, then O += P V with P = exp2(s - max) rounded to elem_t (V tile vt).
template <int MT, int MASK>
__device__ __forceinline__ void attn_tile(float (&o)[MT][DV / 8][4], float (&mrow)[MT][2],
                                          float (&lrow)[MT][2], const int (&qpos)[MT][2],
                                          const elem_t* q, int row0, const elem_t* kt,
                                          const elem_t* vt, int j0, int qpos_min, int len_k,
                                          int window, float scale_log2, float softcap,
                                          int lane) {
  float s[MT][BN / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_frags(s[mt]);
  mma_abt<MT, D, BN, QS, KS>(s, q, row0, kt, lane);  // S = Q K^T
  const bool masked = j0 + BN > len_k || window > 0 || (MASK != 0 && j0 + BN - 1 > qpos_min);
  float base[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, j = j0 + nt * 8 + (lane % 4) * 2 + (e & 1);
        float x = s[mt][nt][e];
#if ATT_SOFTCAP
        x = softcap * tanhf(x * (scale_log2 * LN2) / softcap) * LOG2E;
#else
        (void)softcap;
        x *= scale_log2;
#endif
        if (masked && !key_allowed<MASK>(j, qpos[mt][h], len_k, window)) x = NEG_INF;
        s[mt][nt][e] = x;
        tmax[h] = fmaxf(tmax[h], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mnew = fmaxf(mrow[mt][h], quad_max(tmax[h]));
      base[mt][h] = mnew == NEG_INF ? 0.f : mnew;
      alpha[h] = exp2f(mrow[mt][h] - base[mt][h]);
      mrow[mt][h] = mnew;
      lrow[mt][h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) {
      o[mt][i][0] *= alpha[0];
      o[mt][i][1] *= alpha[0];
      o[mt][i][2] *= alpha[1];
      o[mt][i][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {  // P = exp2(s - max) in elem_t, then O += P V
    unsigned pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int nt = 2 * kk + half;
        const float p0 = exp2f(s[mt][nt][0] - base[mt][0]);
        const float p1 = exp2f(s[mt][nt][1] - base[mt][0]);
        const float p2 = exp2f(s[mt][nt][2] - base[mt][1]);
        const float p3 = exp2f(s[mt][nt][3] - base[mt][1]);
        lrow[mt][0] += p0 + p1;
        lrow[mt][1] += p2 + p3;
        pa[mt][2 * half] = pack2(from_float<elem_t>(p0), from_float<elem_t>(p1));
        pa[mt][2 * half + 1] = pack2(from_float<elem_t>(p2), from_float<elem_t>(p3));
      }
    }
    mma_pb<MT, DV, VS>(o, pa, vt, kk, lane);
  }
}

// Row lane / 4 + 8 h of a 16 x N accumulator, times `mul`, stored at `dst` (N elements of one
// row; each lane writes two adjacent ones per n-tile).
template <int N>
__device__ __forceinline__ void store_frag_row(elem_t* dst, const float (&acc)[N / 8][4], int h,
                                               float mul, int lane) {
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    const int c = i * 8 + (lane % 4) * 2;
    stg<unsigned>(reinterpret_cast<unsigned*>(dst + c),
                  pack2(from_float<elem_t>(acc[i][2 * h] * mul),
                        from_float<elem_t>(acc[i][2 * h + 1] * mul)));
  }
}

}  // namespace dnnctl
