// dnnctl attention backward on mma.sync (sm_80+), FlashAttention-2 style, deterministic:
//
//   attn_bwd_dot   D_i = sum_d dO[i, d] O[i, d] (fp32, laid out like lse)
//   attn_bwd_dkdv  one block per key tile (BN keys, one warp per 16) of one key/value head:
//                  for every query head of its GQA group and every query tile, S^T = K Q^T,
//                  P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D), then
//                  dV += P^T dO and dK += dS^T Q in registers; no atomics (the group's
//                  heads are summed in a fixed order inside the block)
//   attn_bwd_dq    one block per query tile (BM queries, one warp per 16): the same P and dS
//                  recomputed per key tile, dQ += dS K
//
// dQ costs a second pass over S and dP instead of fp32 atomics or per-key-tile partial
// slabs, so the result is bitwise repeatable and the workspace is D_i alone (4 bytes per
// query row). P and dS are rounded to the I/O dtype before their products, as in FA2.
// softcap c: s = c tanh(x / c) and dS picks up (1 - tanh^2).
//
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV (<= 128), ATT_BM, ATT_BN (multiples of 16),
// ATT_MASK 0|1|2, ATT_SOFTCAP 0|1, ATT_VARLEN 0|1.
#include <dnnctl/attention_mma.cuh>

using namespace dnnctl;

static_assert(D % 16 == 0 && DV % 16 == 0 && BN % 16 == 0 && BM % 16 == 0, "tile shapes");

// The capped score (scaled, log2 units) of a raw dot product and the cap's derivative.
__device__ __forceinline__ float score2(float raw, float scale, float softcap, float& dcap) {
#if ATT_SOFTCAP
  const float t = tanhf(raw * scale / softcap);
  dcap = 1.f - t * t;
  return softcap * t * LOG2E;
#else
  dcap = 1.f;
  return raw * scale * LOG2E;
#endif
}

extern "C" __global__ void __launch_bounds__(128)
attn_bwd_dot(const elem_t* __restrict__ o, const elem_t* __restrict__ dout,
             float* __restrict__ dvec, const int* __restrict__ cu_q, const int* __restrict__ cu_k,
             long long o_sb, long long o_sh, long long o_ss, long long l_sb, long long l_sh,
             int seq_q, int seq_kv) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const AttnSeq sq = attn_seq(b, cu_q, cu_k, seq_q, seq_kv);
  if (i >= sq.len_q) return;
  const long long row = (long long)b * o_sb + (long long)h * o_sh + (long long)(sq.q0 + i) * o_ss;
  const float acc = warp_row_dot<DV>(o, dout, row, lane);
  if (lane == 0) stg<float>(dvec + (long long)b * l_sb + (long long)h * l_sh + sq.q0 + i, acc);
}

// ---------------------------------------------------------------------------- dK, dV

constexpr int KV_THREADS = BN / 16 * 32;

extern "C" __global__ void __launch_bounds__(KV_THREADS)
attn_bwd_dkdv(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
              const elem_t* __restrict__ v, const elem_t* __restrict__ dout,
              const float* __restrict__ lse, const float* __restrict__ dvec,
              elem_t* __restrict__ dk, elem_t* __restrict__ dv, const int* __restrict__ cu_q,
              const int* __restrict__ cu_k, long long q_sb, long long q_sh, long long q_ss,
              long long k_sb, long long k_sh, long long k_ss, long long v_sb, long long v_sh,
              long long v_ss, long long o_sb, long long o_sh, long long o_ss, long long l_sb,
              long long l_sh, int seq_q, int seq_kv, int group, int window, float scale,
              float softcap) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  elem_t* Ks = reinterpret_cast<elem_t*>(smem_raw);
  elem_t* Vs = Ks + BN * KS;
  elem_t* Qs = Vs + BN * VS;
  elem_t* dOs = Qs + BM * QS;
  float* Ls = reinterpret_cast<float*>(dOs + BM * VS);  // lse (log2 units) per query
  float* Ds = Ls + BM;                                  // D_i per query

  const int b = blockIdx.z, kvh = blockIdx.y, n0 = blockIdx.x * BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const AttnSeq sq = attn_seq(b, cu_q, cu_k, seq_q, seq_kv);
  if (n0 >= sq.len_k) return;
  const elem_t* kb = k + (long long)b * k_sb + (long long)kvh * k_sh + (long long)sq.k0 * k_ss;
  const elem_t* vb = v + (long long)b * v_sb + (long long)kvh * v_sh + (long long)sq.k0 * v_ss;
  load_tile<D, KS, BN, KV_THREADS>(Ks, sq.len_k - n0, [&](int r) { return kb + (n0 + r) * k_ss; }, k);
  load_tile<DV, VS, BN, KV_THREADS>(Vs, sq.len_k - n0, [&](int r) { return vb + (n0 + r) * v_ss; }, v);
  cp_async_commit();

  // queries that may see a key of this tile
  int i_begin = 0, i_end = sq.len_q;
  if (ATT_MASK != 0) i_begin = max(0, n0 - sq.off);
  if (window > 0) {
    i_end = min(i_end, n0 + BN - 1 - sq.off + window + 1);
    if (ATT_MASK == 0) i_begin = max(0, n0 - sq.off - window);
  }
  i_begin = i_begin / BM * BM;

  float dka[D / 8][4], dva[DV / 8][4];
  zero_frags(dka);
  zero_frags(dva);
  const int key[2] = {n0 + warp * 16 + lane / 4, n0 + warp * 16 + lane / 4 + 8};

  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    const elem_t* qb = q + (long long)b * q_sb + (long long)h * q_sh + (long long)sq.q0 * q_ss;
    const elem_t* ob = dout + (long long)b * o_sb + (long long)h * o_sh + (long long)sq.q0 * o_ss;
    const long long lrow = (long long)b * l_sb + (long long)h * l_sh + sq.q0;
    for (int i0 = i_begin; i0 < i_end; i0 += BM) {
      block_sync();  // the previous tile's readers are done
      load_tile<D, QS, BM, KV_THREADS>(Qs, sq.len_q - i0, [&](int r) { return qb + (i0 + r) * q_ss; }, q);
      load_tile<DV, VS, BM, KV_THREADS>(dOs, sq.len_q - i0, [&](int r) { return ob + (i0 + r) * o_ss; }, dout);
      cp_async_commit();
      for (int r = threadIdx.x; r < BM; r += KV_THREADS) {
        const bool ok = i0 + r < sq.len_q;
        sts<float>(Ls + r, ok ? ldg(lse + lrow + i0 + r) * LOG2E : 0.f);
        sts<float>(Ds + r, ok ? ldg(dvec + lrow + i0 + r) : 0.f);
      }
      cp_async_wait<0>();
      block_sync();

      float st[BM / 8][4], dpt[BM / 8][4];
      zero_frags(st);
      zero_frags(dpt);
      mma_abt<D, BM, KS, QS>(st, Ks, warp * 16, Qs, lane);      // S^T = K Q^T
      mma_abt<DV, BM, VS, VS>(dpt, Vs, warp * 16, dOs, lane);   // dP^T = V dO^T
      // P^T and dS^T (rows: keys, columns: queries)
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + (lane % 4) * 2 + (e & 1), i = i0 + c;
          float dcap;
          const float x = score2(st[nt][e], scale, softcap, dcap);
          const bool ok = i < sq.len_q && key_allowed<ATT_MASK>(key[e / 2], i + sq.off, sq.len_k, window);
          const float p = ok ? exp2f(x - lds<float>(Ls + c)) : 0.f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - lds<float>(Ds + c)) * dcap;
        }
      }
      // dV += P^T dO, dK += dS^T Q (k-dim: the tile's queries)
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        unsigned pa[4], sa[4];
        pack_afrag(pa, st, kk);
        pack_afrag(sa, dpt, kk);
        mma_pb<DV, VS>(dva, pa, dOs, kk, lane);
        mma_pb<D, QS>(dka, sa, Qs, kk, lane);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if (key[hf] >= sq.len_k) continue;
    elem_t* dkr = dk + (long long)b * k_sb + (long long)kvh * k_sh + (long long)(sq.k0 + key[hf]) * k_ss;
    elem_t* dvr = dv + (long long)b * v_sb + (long long)kvh * v_sh + (long long)(sq.k0 + key[hf]) * v_ss;
    store_frag_row<D>(dkr, dka, hf, scale, lane);
    store_frag_row<DV>(dvr, dva, hf, 1.f, lane);
  }
}

// ---------------------------------------------------------------------------- dQ

constexpr int Q_THREADS = BM / 16 * 32;

extern "C" __global__ void __launch_bounds__(Q_THREADS)
attn_bwd_dq(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
            const elem_t* __restrict__ v, const elem_t* __restrict__ dout,
            const float* __restrict__ lse, const float* __restrict__ dvec,
            elem_t* __restrict__ dq, const int* __restrict__ cu_q, const int* __restrict__ cu_k,
            long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh,
            long long k_ss, long long v_sb, long long v_sh, long long v_ss, long long o_sb,
            long long o_sh, long long o_ss, long long l_sb, long long l_sh, int seq_q,
            int seq_kv, int group, int window, float scale, float softcap) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  elem_t* Qs = reinterpret_cast<elem_t*>(smem_raw);
  elem_t* dOs = Qs + BM * QS;
  elem_t* Ks = dOs + BM * VS;
  elem_t* Vs = Ks + 2 * BN * KS;

  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * BM, kvh = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const AttnSeq sq = attn_seq(b, cu_q, cu_k, seq_q, seq_kv);
  if (m0 >= sq.len_q) return;
  const elem_t* qb = q + (long long)b * q_sb + (long long)h * q_sh + (long long)sq.q0 * q_ss;
  const elem_t* ob = dout + (long long)b * o_sb + (long long)h * o_sh + (long long)sq.q0 * o_ss;
  const elem_t* kb = k + (long long)b * k_sb + (long long)kvh * k_sh + (long long)sq.k0 * k_ss;
  const elem_t* vb = v + (long long)b * v_sb + (long long)kvh * v_sh + (long long)sq.k0 * v_ss;

  const int qhi = min(m0 + BM, sq.len_q) - 1;
  int n_begin, n_end;
  key_range<ATT_MASK>(m0, qhi, sq.off, sq.len_k, window, BN, n_begin, n_end);
  const int ntiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;
  auto load_kv = [&](int t, int buf) {
    const int j0 = n_begin + t * BN;
    load_tile<D, KS, BN, Q_THREADS>(Ks + buf * BN * KS, sq.len_k - j0, [&](int r) { return kb + (j0 + r) * k_ss; }, k);
    load_tile<DV, VS, BN, Q_THREADS>(Vs + buf * BN * VS, sq.len_k - j0, [&](int r) { return vb + (j0 + r) * v_ss; }, v);
  };
  load_tile<D, QS, BM, Q_THREADS>(Qs, sq.len_q - m0, [&](int r) { return qb + (m0 + r) * q_ss; }, q);
  load_tile<DV, VS, BM, Q_THREADS>(dOs, sq.len_q - m0, [&](int r) { return ob + (m0 + r) * o_ss; }, dout);
  if (ntiles > 0) load_kv(0, 0);
  cp_async_commit();

  int row[2];
  float lse2[2], dval[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    row[hf] = m0 + warp * 16 + lane / 4 + 8 * hf;
    const long long li = (long long)b * l_sb + (long long)h * l_sh + sq.q0 + row[hf];
    const bool ok = row[hf] < sq.len_q;
    lse2[hf] = ok ? ldg(lse + li) * LOG2E : 0.f;
    dval[hf] = ok ? ldg(dvec + li) : 0.f;
  }
  float dqa[D / 8][4];
  zero_frags(dqa);

  for (int t = 0; t < ntiles; ++t) {
    kv_tile_ready(t, ntiles, load_kv);
    const elem_t* Kt = Ks + (t & 1) * BN * KS;
    const elem_t* Vt = Vs + (t & 1) * BN * VS;
    float s[BN / 8][4], dp[BN / 8][4];
    zero_frags(s);
    zero_frags(dp);
    mma_abt<D, BN, QS, KS>(s, Qs, warp * 16, Kt, lane);     // S = Q K^T
    mma_abt<DV, BN, VS, VS>(dp, dOs, warp * 16, Vt, lane);  // dP = dO V^T
    const int j0 = n_begin + t * BN;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e / 2, j = j0 + nt * 8 + (lane % 4) * 2 + (e & 1);
        float dcap;
        const float x = score2(s[nt][e], scale, softcap, dcap);
        const bool ok = row[hf] < sq.len_q &&
                        key_allowed<ATT_MASK>(j, row[hf] + sq.off, sq.len_k, window);
        const float p = ok ? exp2f(x - lse2[hf]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - dval[hf]) * dcap;  // dS
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {  // dQ += dS K
      unsigned sa[4];
      pack_afrag(sa, s, kk);
      mma_pb<D, KS>(dqa, sa, Kt, kk, lane);
    }
    block_sync();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if (row[hf] >= sq.len_q) continue;
    elem_t* dqr = dq + (long long)b * q_sb + (long long)h * q_sh + (long long)(sq.q0 + row[hf]) * q_ss;
    store_frag_row<D>(dqr, dqa, hf, scale, lane);
  }
}
