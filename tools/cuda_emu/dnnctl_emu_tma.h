// Emulated copy-engine primitives (kernels/include/dnnctl/tma.cuh includes this file when
// built with -DDNNCTL_EMU); the implementation is emu_tma_runtime.h. Semantics follow the
// PTX ISA: an mbarrier phase completes when its pending arrivals reach zero and its expected
// transaction bytes have all landed; try_wait.parity P returns once the phase of parity P is
// complete; a TMA box copy is in flight (its shared bytes may be neither read nor written)
// until a thread waiting on its barrier lets it land. The emulator fails on: waits or
// arrivals on uninitialized barriers, more arrivals than expected, copies landing on bytes a
// wgmma in flight reads, copies never landed when the block ends, boxes beyond 256, shared
// destinations not 128-byte aligned, named barriers whose thread count differs between
// arrivals. The tensor map is the emulator's own encoding (tools/cuda_emu/emu.py
// ``emu_tensor_map``), not the driver's.
#pragma once

#define __grid_constant__

namespace dnnctl {

struct TmaMap;

void emu_mbar_init(unsigned bar, unsigned count);
void emu_mbar_wait(unsigned bar, unsigned parity);
void emu_mbar_arrive(unsigned bar, unsigned tx_bytes);
void emu_tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar);
void emu_bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes);
void emu_named_sync(int id, int threads);
void emu_named_arrive(int id, int threads);

inline void mbar_init(unsigned bar, unsigned count) { emu_mbar_init(bar, count); }
inline void mbar_init_fence() {}
inline void mbar_wait(unsigned bar, unsigned parity) { emu_mbar_wait(bar, parity); }
inline void mbar_wait_or_trap(unsigned bar, unsigned parity) { emu_mbar_wait(bar, parity); }
inline void mbar_arrive(unsigned bar) { emu_mbar_arrive(bar, 0); }
inline void mbar_expect_tx(unsigned bar, unsigned bytes) { emu_mbar_arrive(bar, bytes); }
inline void tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
  emu_tma_load_3d(dst, map, c0, c1, c2, bar);
}
// the thread's cp.async copies land now, then the arrival (the emulator is synchronous)
inline void cp_async_mbar_arrive(unsigned bar) {
  emu_cp_async_commit();
  emu_cp_async_wait(0);
  emu_mbar_arrive(bar, 0);
}
inline void tma_prefetch_map(const TmaMap*) {}
inline void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  emu_bulk_reduce_add_f32(dst, src, bytes);
}
inline void bulk_commit() {}
template <int N>
inline void bulk_wait_read() {}
template <int N>
inline void bulk_wait() {}
inline void named_sync(int id, int threads) { emu_named_sync(id, threads); }
inline void named_arrive(int id, int threads) { emu_named_arrive(id, threads); }
template <int REGS>
inline void setmaxnreg_dec() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg range");
}
template <int REGS>
inline void setmaxnreg_inc() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg range");
}
inline void warp_sync() { emu::warp_barrier(); }

}  // namespace dnnctl
