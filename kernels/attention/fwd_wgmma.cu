// dnnctl attention forward for Hopper (sm_90a), FlashAttention-3 style: TMA loads, wgmma for
// both products, a producer warpgroup and CONS consumer warpgroups of 64 query rows each.
//
//   producer (one thread): Q tile once (q_full), then for each key tile t, stage s = t % ST,
//     round r = t / ST: wait k_empty[s] (parity (r & 1) ^ 1: the first round passes), TMA the
//     K box into stage s (k_full[s]); likewise V (v_empty[s] / v_full[s]), so S = Q K^T of a
//     tile can start before its V has landed.
//   consumer warpgroup c, rows c * 64 .. c * 64 + 63 of the block's BM:
//       S_0 = Q K_0^T; softmax -> P_0 (registers)
//       for t = 1 ..: issue S_t = Q K_t^T; issue O += P_{t-1} V_{t-1}   (both async)
//                     wait S_t (wait_group 1); release K stage; softmax of S_t in fp32 while
//                     the tensor cores run P V; wait it (wait_group 0); release V stage;
//                     rescale O by the max's correction; P_t = S_t rounded to the I/O dtype
//       O += P_last V_last; O / rowsum stored, lse = (max + log2 rowsum) ln 2.
//     ATT_OVERLAP 0: one product at a time (S_t, softmax, P_t V_t, wait), so S and P are never
//     live together: BN / 4 fewer registers, which lets 128-key tiles fit two consumers at
//     head dim 128.
//     ATT_PINGPONG: the consumers take turns to issue their products (named barrier 1 + c:
//     "consumer c may issue", passed on round-robin after issuing), so one warpgroup's
//     softmax runs while the other's products occupy the tensor cores.
//     The accumulator pairs of S are the A fragment of the next product (dnnctl/wgmma.cuh,
//     register-A form), so P never touches shared memory.
//
// Registers: the block starts at the even share (65536 / threads: 255, 168 and 128 for 1, 2
// and 3 consumers); with two or three consumers the producer gives its warpgroup's down to
// 24 (setmaxnreg.dec) and the consumers take them (setmaxnreg.inc: 240 and 160), which
// ptxas compiles their code for as long as it holds no __trap (the consumers' mbar_wait is a
// plain spin; see dnnctl/tma.cuh). The host side keeps S (BN / 2) + O (DVP / 2) + P (BN / 4)
// inside each budget (dnnctl/ops/attention/wgmma.py).
//
// Shared memory (1024-byte aligned atoms, 128-byte swizzle written by the copy engine):
//   Q: KC chunks of BM rows x 64 head-dim elements (K-major A operand of S = Q K^T);
//   K stage: KC chunks of BN rows x 64 (K-major B operand: the scores' N is the key);
//   V stage: VC chunks of BN key rows x 64 value columns (MN-major B operand of O += P V: the
//     reduction runs over keys, N over the value dimension; LBO = BN * 128 to the next chunk).
// Head dims that are not multiples of 64 are zero-filled by the copy engine (the box reads
// past the tensor's innermost extent), so they add nothing to either product.
//
// Tensor maps: <dnnctl/attention_tma.cuh>.
// Tiles that run past a sequence read zeros (BHSD) or the next sequence's rows (BSHD /
// varlen): keys past the end are masked to -inf (P = 0), queries past it are not stored.
//
// Defines: DNNCTL_DTYPE 1|2, ATT_D, ATT_DV (multiples of 8, <= 256), ATT_CONS 1..3, ATT_BN
// (64 | 128), ATT_STAGES, ATT_MASK 0|1|2, ATT_SOFTCAP 0|1, ATT_VARLEN 0|1, ATT_LAYOUT 0|1,
// ATT_PINGPONG 0|1, ATT_OVERLAP 0|1.
#include <dnnctl/attention_tma.cuh>
#include <dnnctl/mufu.cuh>
#include <dnnctl/wgmma.cuh>

using namespace dnnctl;

#ifndef ATT_CONS
#define ATT_CONS 2
#endif
#ifndef ATT_BN
#define ATT_BN 128
#endif
#ifndef ATT_PINGPONG
#define ATT_PINGPONG 0
#endif
#ifndef ATT_OVERLAP
#define ATT_OVERLAP 1
#endif

#if DNNCTL_DTYPE == 0
#error "fwd_wgmma.cu is the fp16 / bf16 kernel (DNNCTL_DTYPE 1 or 2)"
#endif

constexpr int D = ATT_D, DV = ATT_DV, CONS = ATT_CONS, BN = ATT_BN, ST = ATT_STAGES;
constexpr int BM = 64 * CONS;                          // query rows per block
constexpr int NT = 128 * (CONS + 1);                   // producer + consumers
constexpr int KC = (D + 63) / 64;                      // 64-wide head-dim chunks of q / k
constexpr int DVP = DV <= 64 ? 64 : (DV <= 128 ? 128 : 256);  // wgmma N of O += P V
constexpr int VC = DVP / 64;
constexpr int Q_BYTES = KC * BM * 128, K_BYTES = KC * BN * 128, V_BYTES = VC * BN * 128;
constexpr int K_OFF = Q_BYTES, V_OFF = K_OFF + ST * K_BYTES, BAR_OFF = V_OFF + ST * V_BYTES;
static_assert(D % 8 == 0 && DV % 8 == 0 && D <= 256 && DV <= 256, "head dims");
static_assert(BN == 64 || BN == 128, "key tile is one wgmma N (64 or 128)");
static_assert(CONS >= 1 && CONS <= 3 && ST >= 2, "warpgroups and stages");
constexpr bool PINGPONG = ATT_PINGPONG != 0 && CONS > 1;
// per-thread registers after the hand-over (CONS == 1 keeps the entry share, 255):
// 128 x 24 + CONS x 128 x CONSUMER_REGS <= 65536
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = CONS == 2 ? 240 : 160;
constexpr bool OVERLAP = ATT_OVERLAP != 0;

namespace {

__device__ __forceinline__ void release(unsigned bar, int lane) {
  warp_sync();
  if (lane == 0) mbar_arrive(bar);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, 1)
    attn_fwd_wgmma(const __grid_constant__ TmaMap tmQ, const __grid_constant__ TmaMap tmK,
                   const __grid_constant__ TmaMap tmV, elem_t* __restrict__ out,
                   float* __restrict__ lse, const int* __restrict__ cu_q,
                   const int* __restrict__ cu_k, long long o_sb, long long o_sh,
                   long long o_ss, long long l_sb, long long l_sh, int seq_q, int seq_kv,
                   int heads_q, int group, int window, float scale_log2, float softcap) {
  DNNCTL_DECLARE_SMEM(smem_raw);
  const unsigned s0 = smem_u32(wg_align_smem(smem_raw));
  const unsigned q_full = s0 + BAR_OFF;
  const unsigned k_full0 = q_full + 8, k_empty0 = k_full0 + 8 * ST;
  const unsigned v_full0 = k_empty0 + 8 * ST, v_empty0 = v_full0 + 8 * ST;

  const int b = blockIdx.z, h = blockIdx.y, kv_head = h / group;
  const int heads_kv = heads_q / group;
#if ATT_VARLEN
  const int q0 = cu_q[b], len_q = cu_q[b + 1] - q0;
  const int k0 = cu_k[b], len_k = cu_k[b + 1] - k0;
#else
  const int q0 = b * seq_q, len_q = seq_q, k0 = b * seq_kv, len_k = seq_kv;
#endif
  // heaviest (causal: last) row blocks first
  const int m0 = (ATT_MASK != 0 ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x) * BM;
  if (m0 >= len_q) return;
  const int off = ATT_MASK == 1 ? 0 : len_k - len_q;  // key position of query 0
  const int qhi = min(m0 + BM, len_q) - 1;
  int n_begin, n_end;
  key_range<ATT_MASK>(m0, qhi, off, len_k, window, BN, n_begin, n_end);
  const int ntiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(k_full0 + 8 * s, 1);
      mbar_init(v_full0 + 8 * s, 1);
      mbar_init(k_empty0 + 8 * s, 4 * CONS);  // one arrival per consumer warp
      mbar_init(v_empty0 + 8 * s, 4 * CONS);
    }
    mbar_init_fence();
  }
  block_sync();
  const int wg = (int)threadIdx.x >> 7;

  if (wg == 0) {  // ------------------------------------------------------------ producer
    if constexpr (CONS > 1) setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0 && ntiles > 0) {
      tma_prefetch_map(&tmQ);
      tma_prefetch_map(&tmK);
      tma_prefetch_map(&tmV);
      mbar_expect_tx(q_full, Q_BYTES);
      load_rows(s0, &tmQ, KC, BM * 128, m0, h, heads_q, b, q0, q_full);
#pragma unroll 1
      for (int t = 0; t < ntiles; ++t) {
        const int s = t % ST;
        const unsigned par = ((t / ST) & 1) ^ 1u;
        const int j0 = n_begin + t * BN;
        mbar_wait_or_trap(k_empty0 + 8 * s, par);
        mbar_expect_tx(k_full0 + 8 * s, K_BYTES);
        load_rows(s0 + K_OFF + s * K_BYTES, &tmK, KC, BN * 128, j0, kv_head, heads_kv, b, k0,
                  k_full0 + 8 * s);
        mbar_wait_or_trap(v_empty0 + 8 * s, par);
        mbar_expect_tx(v_full0 + 8 * s, V_BYTES);
        load_rows(s0 + V_OFF + s * V_BYTES, &tmV, VC, BN * 128, j0, kv_head, heads_kv, b, k0,
                  v_full0 + 8 * s);
      }
    }
    return;
  }

  // ------------------------------------------------------------------------- consumers
  if constexpr (CONS > 1) setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 1;
  const int tid = (int)threadIdx.x & 127, lane = tid & 31, warp = tid >> 5;
  const int row0 = cw * 64 + warp * 16 + (lane >> 2);  // block rows row0, row0 + 8
  int qpos[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int qi = m0 + row0 + 8 * hh;
    qpos[hh] = qi < len_q ? qi + off : -(1 << 30);  // padding rows allow no key
  }
  const int qpos_min = m0 + off;  // a tile ending at or below it needs no causal mask

  float o[DVP / 2];
#pragma unroll
  for (int i = 0; i < DVP / 2; ++i) o[i] = 0.f;
  float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
  float s[BN / 2];
  unsigned p[BN / 4];

  // S = Q K^T of the tile in K stage `st` (its accumulators overwritten), one group.
  auto issue_s = [&](int st) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_fence_acc(s[i]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < KC; ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned long long da =
            wg_desc(s0 + c * BM * 128 + cw * 64 * 128 + kk * 32, 16, 1024);
        const unsigned long long db =
            wg_desc(s0 + K_OFF + st * K_BYTES + c * BN * 128 + kk * 32, 16, 1024);
        wgmma_async<BN, 0, 0, elem_t>(s, da, db, (c | kk) != 0);
      }
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_fence_acc(s[i]);
  };
  // O += P V of the tile in V stage `st`, one group.
  auto issue_pv = [&](int st) {
#pragma unroll
    for (int i = 0; i < DVP / 2; ++i) wg_fence_acc(o[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) wg_fence_reg(p[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned long long db =
          wg_desc(s0 + V_OFF + st * V_BYTES + kk * 16 * 128, BN * 128, 1024);
      const unsigned a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      wgmma_async_rs<DVP, 1, elem_t>(o, a, db, 1);
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < DVP / 2; ++i) wg_fence_acc(o[i]);
  };
  // Mask S of key tile t in place (and cap it), fold it into the running max (log2 units),
  // turn it into exp2(scale S - max) and add the row sums; `corr` is the factor the old O and
  // sums shrink by. Without softcap the raw scores stay unscaled until the exponent (one FMA:
  // the host guarantees scale > 0, so the raw maximum is the scaled one's).
  auto softmax = [&](int t, float (&corr)[2]) {
    const int j0 = n_begin + t * BN;
    const bool masked =
        j0 + BN > len_k || window > 0 || (ATT_MASK != 0 && j0 + BN - 1 > qpos_min);
    float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e >> 1, j = j0 + 8 * i + 2 * (lane & 3) + (e & 1);
        float x = s[4 * i + e];
#if ATT_SOFTCAP
        x = softcap * tanhf(x * (scale_log2 * LN2) / softcap) * LOG2E;
#endif
        if (masked && !key_allowed<ATT_MASK>(j, qpos[hh], len_k, window)) x = NEG_INF;
        s[4 * i + e] = x;
        tmax[hh] = fmaxf(tmax[hh], x);
      }
    }
#if ATT_SOFTCAP
    constexpr float c = 1.f;  // already in log2 units
#else
    const float c = scale_log2;
#endif
    float nbase[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mnew = fmaxf(mrow[hh], quad_max(tmax[hh]) * c);
      const float base = mnew == NEG_INF ? 0.f : mnew;
      corr[hh] = ex2_approx(mrow[hh] - base);
      nbase[hh] = -base;
      mrow[hh] = mnew;
    }
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = ex2_approx(fmaf(s[4 * i + e], c, nbase[e >> 1]));
        s[4 * i + e] = x;
        sum[e >> 1] += x;
      }
    }
    lrow[0] = lrow[0] * corr[0] + sum[0];
    lrow[1] = lrow[1] * corr[1] + sum[1];
  };
  auto to_p = [&]() {
#pragma unroll
    for (int i = 0; i < BN / 4; ++i)
      p[i] = pack2(from_float<elem_t>(s[2 * i]), from_float<elem_t>(s[2 * i + 1]));
  };

  // Issue turns (ATT_PINGPONG). Every consumer has ntiles + 1 issue points (2 ntiles without
  // overlap); the last one's
  // handoff from the last consumer would find no one waiting, so it is not made.
  auto turn_wait = [&]() {
    if constexpr (PINGPONG) named_sync(1 + cw, 256);
  };
  auto turn_pass = [&](bool last) {
    if constexpr (PINGPONG) {
      if (!(last && cw == CONS - 1)) named_arrive(1 + (cw + 1) % CONS, 256);
    }
  };

  // After a wait: this product's accumulators are final and its stage goes back.
  auto s_done = [&](int st) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_fence_acc(s[i]);
    release(k_empty0 + 8 * st, lane);
  };
  auto pv_done = [&](int st) {
#pragma unroll
    for (int i = 0; i < DVP / 2; ++i) wg_fence_acc(o[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) wg_fence_reg(p[i]);
    release(v_empty0 + 8 * st, lane);
  };
  auto rescale = [&](const float (&corr)[2]) {
#pragma unroll
    for (int i = 0; i < DVP / 8; ++i) {
      o[4 * i] *= corr[0];
      o[4 * i + 1] *= corr[0];
      o[4 * i + 2] *= corr[1];
      o[4 * i + 3] *= corr[1];
    }
  };

  if (ntiles > 0) {
    if constexpr (PINGPONG) {
      if (cw == CONS - 1) named_arrive(1, 256);  // consumer 0 issues first
    }
    mbar_wait(q_full, 0);
  }
  float corr[2];
  if (OVERLAP && ntiles > 0) {
    mbar_wait(k_full0, 0);
    turn_wait();
    issue_s(0);
    turn_pass(false);
    wgmma_wait<0>();
    s_done(0);
    softmax(0, corr);
    to_p();
#pragma unroll 1
    for (int t = 1; t < ntiles; ++t) {
      const int st = t % ST, pst = (t - 1) % ST;
      mbar_wait(k_full0 + 8 * st, (t / ST) & 1);
      mbar_wait(v_full0 + 8 * pst, ((t - 1) / ST) & 1);
      turn_wait();
      issue_s(st);
      issue_pv(pst);
      turn_pass(false);
      wgmma_wait<1>();
      s_done(st);
      softmax(t, corr);  // while the tensor cores run P V
      wgmma_wait<0>();
      pv_done(pst);
      rescale(corr);
      to_p();
    }
    const int lst = (ntiles - 1) % ST;
    mbar_wait(v_full0 + 8 * lst, ((ntiles - 1) / ST) & 1);
    turn_wait();
    issue_pv(lst);
    turn_pass(true);
    wgmma_wait<0>();
    pv_done(lst);
  }
  if (!OVERLAP) {  // one product at a time: S and P never live together
#pragma unroll 1
    for (int t = 0; t < ntiles; ++t) {
      const int st = t % ST;
      const unsigned par = (t / ST) & 1;
      mbar_wait(k_full0 + 8 * st, par);
      turn_wait();
      issue_s(st);
      turn_pass(false);
      wgmma_wait<0>();
      s_done(st);
      softmax(t, corr);
      rescale(corr);
      to_p();
      mbar_wait(v_full0 + 8 * st, par);
      turn_wait();
      issue_pv(st);
      turn_pass(t == ntiles - 1);
      wgmma_wait<0>();
      pv_done(st);
    }
  }

  // finish: full row sums, normalize, store out and lse
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = quad_sum(lrow[hh]);
    const int qi = m0 + row0 + 8 * hh;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float row_lse = l > 0.f ? (mrow[hh] + log2f(l)) * LN2 : NEG_INF;
    if (qi >= len_q) continue;
#if ATT_VARLEN
    elem_t* orow = out + (long long)h * o_sh + (long long)(q0 + qi) * o_ss;
    float* lrow_out = lse + (long long)h * l_sh + q0 + qi;
#else
    elem_t* orow = out + (long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss;
    float* lrow_out = lse + (long long)b * l_sb + (long long)h * l_sh + qi;
#endif
#pragma unroll
    for (int i = 0; i < DVP / 8; ++i) {
      const int c = 8 * i + 2 * (lane & 3);
      if (c < DV)
        stg<unsigned>(reinterpret_cast<unsigned*>(orow + c),
                      pack2(from_float<elem_t>(o[4 * i + 2 * hh] * inv),
                            from_float<elem_t>(o[4 * i + 2 * hh + 1] * inv)));
    }
    if ((lane & 3) == 0) stg<float>(lrow_out, row_lse);
  }
}
