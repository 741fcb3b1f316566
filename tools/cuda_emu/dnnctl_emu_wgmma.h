// Emulated wgmma primitives (kernels/include/dnnctl/wgmma.cuh includes this file when built
// with -DDNNCTL_EMU); the implementation is emu_wgmma_runtime.h. Semantics follow the PTX ISA:
// operands are read from shared memory through the matrix descriptors (128-byte swizzle,
// canonical K-major / MN-major layouts), results land in the accumulators when the group
// completes (wgmma.wait_group), and the emulator fails on: a wgmma without wgmma.fence since
// the last commit, operand bytes with a cp.async in flight, written in the current barrier
// interval, or written through the generic proxy without the writer's fence.proxy.async; a
// shared store into bytes an unfinished wgmma reads; a thread exiting with wgmma pending.
#pragma once

namespace dnnctl {

void emu_fence_proxy_async();
void emu_wgmma_fence();
void emu_wgmma_commit();
void emu_wgmma_wait(int n);
void emu_wgmma(float* d, int n, unsigned long long da, unsigned long long db, int scale_d,
               int trans_a, int trans_b, int bf16);
void emu_wgmma_rs(float* d, int n, const unsigned* a, unsigned long long db, int scale_d,
                  int trans_b, int bf16);

inline void fence_proxy_async() { emu_fence_proxy_async(); }
inline void wgmma_fence() { emu_wgmma_fence(); }
inline void wgmma_commit() { emu_wgmma_commit(); }
template <int N>
inline void wgmma_wait() { emu_wgmma_wait(N); }
inline void wg_fence_acc(float&) {}

template <int N, int TA, int TB, typename T>
inline void wgmma_async(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                        int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "emulated N");
  emu_wgmma(d, N, da, db, scale_d, TA, TB, WgIsBf16<T>::value ? 1 : 0);
}

template <int N, int TB, typename T>
inline void wgmma_async_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db,
                           int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "emulated register-A N");
  emu_wgmma_rs(d, N, a, db, scale_d, TB, WgIsBf16<T>::value ? 1 : 0);
}
inline void wg_fence_reg(unsigned&) {}

}  // namespace dnnctl
