// dnnctl Hopper copy-engine primitives (sm_90): mbarriers with transaction counts, TMA tensor
// copies (cp.async.bulk.tensor) into shared memory, named barriers and setmaxnreg.
//
// PTX ISA (8.0 and later):
//   mbarrier (9.7.12.15): init with an expected arrival count; arrive.expect_tx adds a byte
//     count the copies must complete (complete_tx) before the phase can complete;
//     try_wait.parity P returns once the phase of parity P has completed (on a fresh barrier
//     the phase "before" phase 0, parity 1, counts as completed).
//   cp.async.bulk.tensor (9.7.9.25): a box of a tensor map into shared memory, completing on
//     an mbarrier; out-of-bounds elements are zero-filled and count towards the bytes.
//   setmaxnreg (9.7.17.1): a warpgroup-wide register budget change (needs a launch-time
//     register cap: __launch_bounds__(threads, 1)).
//
// The tensor map (CUtensorMap, 128 bytes, 64-byte aligned) is a __grid_constant__ kernel
// parameter encoded on the host (dnnctl/backends/tma.py). Built with -DDNNCTL_EMU the same
// names run on the CPU emulator (tools/cuda_emu), which copies the boxes itself.
#pragma once
#include <dnnctl/ptx.cuh>

namespace dnnctl {

struct __align__(64) TmaMap {
  unsigned long long opaque[16];
};

}  // namespace dnnctl

#ifdef DNNCTL_EMU
#include <dnnctl_emu_tma.h>
#else

namespace dnnctl {

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Make the initialized barriers visible to the copy engine (before a block barrier).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Wait for the phase of parity `parity`: the consumers' wait, a plain spin. A __trap in a
// warpgroup that raised its budget with setmaxnreg makes ptxas allocate that code at the
// block's entry share (measured, sm_90a: attention with two consumers of 128-key tiles spills
// 312 bytes and serializes its wgmma with it, uses 210 of 240 registers cleanly without).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// The producer's wait: one that never ends (a protocol bug: the consumers never release a
// stage) traps after 2^26 unsuccessful tries (seconds: each try suspends the thread for a
// while), so a broken pipeline fails its launch instead of hanging the process.
__device__ __forceinline__ void mbar_wait_or_trap(unsigned bar, unsigned parity) {
  unsigned tries = 0;
  while (!mbar_try_wait(bar, parity)) {
    if (++tries == (1u << 26)) __trap();
  }
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

// Box at (c0, c1, c2) of a 3-d map into shared address dst, completing on bar.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1,
                                            int c2, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// cp.async.mbarrier.arrive.noinc (9.7.9.24.x): an arrival on bar once every cp.async this
// thread issued so far has landed (the barrier's count includes these arrivals: noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Bulk reduction (9.7.9.24 cp.reduce.async.bulk): global[dst .. dst + bytes) += the fp32
// values at shared address src, by the copy engine; 16-byte aligned, bytes a multiple of
// 16. Completion: bulk_commit, then bulk_wait_read<0> (the shared source may be rewritten)
// or bulk_wait<0> (the global writes are done).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map))
               : "memory");
}

// bar.sync on barrier `id` (1..15) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive on barrier `id`: counts this warp's threads towards `threads` without waiting
// (the producer side of a named-barrier handoff; the waiting side calls named_sync).
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
}

__device__ __forceinline__ void warp_sync() { __syncwarp(); }

}  // namespace dnnctl
#endif  // DNNCTL_EMU
