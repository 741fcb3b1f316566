// dnnctl MUFU approximations (memory-bound ops, attention's softmax).
#pragma once

namespace dnnctl {

// MUFU approximations without IEEE fix-ups: ex2.approx.ftz / rcp.approx.ftz (relative error
// below 2^-21; results under 2^-126 flush to zero). One instruction each, where __expf costs
// five (denormal scaling) and __frcp_rn ten (round-to-nearest with a slow path): the
// transcendental activations on 16-bit data are otherwise issue-bound, not memory-bound.
// The CPU emulator evaluates them exactly.
__device__ __forceinline__ float ex2_approx(float x) {
#ifdef DNNCTL_EMU
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

__device__ __forceinline__ float rcp_approx(float x) {
#ifdef DNNCTL_EMU
  return 1.f / x;
#else
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

}  // namespace dnnctl
