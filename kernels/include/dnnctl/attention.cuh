// dnnctl attention helpers: quad shuffles of mma fragments and the key mask.
#pragma once
#include <dnnctl/ptx.cuh>

// The problem defines every attention kernel takes: ATT_MASK 0|1|2 (none, top_left,
// bottom_right), ATT_SOFTCAP 0|1, ATT_VARLEN 0|1.
#ifndef ATT_MASK
#define ATT_MASK 0
#endif
#ifndef ATT_SOFTCAP
#define ATT_SOFTCAP 0
#endif
#ifndef ATT_VARLEN
#define ATT_VARLEN 0
#endif

namespace dnnctl {

// The kernels exponentiate with exp2: scores and lse enter in log2 units.
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;  // lse back to natural log: log2 x LN2


#ifdef DNNCTL_EMU
#define NEG_INF (-HUGE_VALF)
// A butterfly exchange among the lanes of the current warp (every lane must take part).
inline float attn_shfl_xor(float v, int o) {
  const int lane = emu::cur->lane;
  std::memcpy(emu::warp_slot(lane), &v, 4);
  emu::warp_barrier();
  float r;
  std::memcpy(&r, emu::warp_slot(lane ^ o), 4);
  emu::warp_barrier();
  return r;
}
#else
#define NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ float attn_shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
#endif

// Reductions over the 4 lanes that hold one row of an m16n8 accumulator.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, attn_shfl_xor(v, 1));
  return fmaxf(v, attn_shfl_xor(v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += attn_shfl_xor(v, 1);
  return v + attn_shfl_xor(v, 2);
}

// Key j may be read by the query at key position qpos (= query index + mask offset):
// MASK 0 none, 1 top_left, 2 bottom_right (causal); window w > 0 bounds the distance.
template <int MASK>
__device__ __forceinline__ bool key_allowed(int j, int qpos, int len_k, int window) {
  if (j >= len_k) return false;
  if (MASK != 0 && j > qpos) return false;
  if (window > 0) {
    if (j < qpos - window) return false;
    if (MASK == 0 && j > qpos + window) return false;
  }
  return true;
}

// The keys [begin, end) that queries qlo .. qhi (key positions q + off) may read under mask
// MASK and window w, begin rounded down to a multiple of the key tile bn.
template <int MASK>
__device__ __forceinline__ void key_range(int qlo, int qhi, int off, int len_k, int window,
                                          int bn, int& begin, int& end) {
  begin = 0;
  end = len_k;
  if (MASK != 0) end = min(end, qhi + off + 1);
  if (window > 0) {
    begin = max(0, qlo + off - window);
    if (MASK == 0) end = min(end, qhi + off + window + 1);
  }
  begin = begin / bn * bn;
}

// One sequence's rows: query / key row offsets (varlen: cu_seqlens; else 0), lengths, and
// the key position of query 0 (top-left mask: 0; else len_k - len_q, bottom-right).
struct AttnSeq {
  int q0, len_q, k0, len_k, off;
};

__device__ __forceinline__ AttnSeq attn_seq(int b, const int* cu_q, const int* cu_k,
                                            int seq_q, int seq_kv) {
  AttnSeq s;
#if ATT_VARLEN
  s.q0 = cu_q[b];
  s.len_q = cu_q[b + 1] - s.q0;
  s.k0 = cu_k[b];
  s.len_k = cu_k[b + 1] - s.k0;
#else
  (void)b;
  (void)cu_q;
  (void)cu_k;
  s.q0 = 0;
  s.len_q = seq_q;
  s.k0 = 0;
  s.len_k = seq_kv;
#endif
  s.off = ATT_MASK == 1 ? 0 : s.len_k - s.len_q;
  return s;
}

// D_i = sum_c dO[i, c] O[i, c] of the row at `row` (DV columns), summed over the warp:
// every lane gets it (the backward's row term).
template <int DV, class T>
__device__ __forceinline__ float warp_row_dot(const T* o, const T* dout, long long row,
                                              int lane) {
  float acc = 0.f;
  for (int c = lane; c < DV; c += 32) acc += to_float(ldg(o + row + c)) * to_float(ldg(dout + row + c));
  for (int w = 16; w > 0; w >>= 1) acc += attn_shfl_xor(acc, w);
  return acc;
}

// Copy a (ROWS x W) tile of global rows (row i at ptr_of(i)) into shared memory with row
// stride S elements, 16 bytes per cp.async; rows from `valid` on are zero-filled.
template <int W, int S, int ROWS, int THREADS, class T, class PtrOf>
__device__ __forceinline__ void load_tile(T* smem, int valid, PtrOf ptr_of, const T* any) {
  constexpr int CH = W / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
    const int r = c / CH, col = (c % CH) * 8;
    const bool ok = r < valid;
    const T* src = ok ? ptr_of(r) + col : any;
    cp_async<16>(smem + r * S + col, src, ok);
  }
}

}  // namespace dnnctl
