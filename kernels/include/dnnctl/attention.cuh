// dnnctl attention helpers: quad shuffles of mma fragments and the key mask.
#pragma once
#include <dnnctl/ptx.cuh>

namespace dnnctl {


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

}  // namespace dnnctl
