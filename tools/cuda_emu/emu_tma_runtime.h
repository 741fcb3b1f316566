// Implementation of the emulated copy-engine primitives (dnnctl_emu_tma.h); included at the
// end of emu_runtime.h. One block runs at a time: barrier state is reset per block.
#pragma once
#include <map>

namespace dnnctl {
struct TmaMap;  // kernels/include/dnnctl/tma.cuh (not included by every kernel)
}

namespace emu {

struct TmaCopy {  // one box in flight: the bytes it will write (already read from global)
  size_t dst;
  std::vector<unsigned char> data;
};

struct MBar {
  unsigned count = 0;     // arrivals per phase
  unsigned pending = 0;   // arrivals still missing in the current phase
  long long tx = 0;       // transaction bytes still expected in the current phase
  long phase = 0;         // completed phases
  std::vector<TmaCopy> copies;
};

inline std::map<unsigned, MBar> g_mbars;
inline std::map<int, Bar> g_named;
inline std::map<int, int> g_named_threads;

// The emulator's tensor map (tools/cuda_emu/emu.py emu_tensor_map): 128 bytes.
struct EmuMap {
  unsigned long long magic, address;
  unsigned long long dims[3], strides[2];  // strides in bytes, of dims 1 and 2
  unsigned long long box[3], esz, swizzle;
};
constexpr unsigned long long kMapMagic = 0x544d41454d55ull;  // "TMAEMU"

static MBar& mbar(unsigned bar, const char* what) {
  auto it = g_mbars.find(bar);
  if (it == g_mbars.end()) fail(std::string(what) + ": mbarrier not initialized");
  return it->second;
}

// A completed phase orders the arrivals' earlier shared writes (mbarrier.arrive releases)
// before the waiters' later accesses (try_wait acquires): a new barrier interval.
static void complete_phase_if_done(MBar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
    ++g_progress;
    ++g_epoch;
  }
}

static void land(MBar& b) {
  for (TmaCopy& c : b.copies) {
    for (size_t i = 0; i < c.data.size(); ++i) {
      Shadow& s = g_shadow[c.dst + i];
      --s.pending;
      if (s.async_reads) fail("TMA copy lands on shared bytes a wgmma in flight reads");
    }
    std::memcpy(g_smem + c.dst, c.data.data(), c.data.size());
    b.tx -= (long long)c.data.size();
  }
  b.copies.clear();
  if (b.tx < 0) fail("mbarrier: more transaction bytes landed than expected");
  ++g_progress;
  complete_phase_if_done(b);
}

inline void tma_block_reset() {
  g_mbars.clear();
  g_named.clear();
  g_named_threads.clear();
}

inline void tma_block_end() {
  for (auto& kv : g_mbars)
    if (!kv.second.copies.empty()) fail("block ended with TMA copies that never landed");
}

}  // namespace emu

namespace dnnctl {

void emu_mbar_init(unsigned bar, unsigned count) {
  if (bar % 8) emu::fail("mbarrier.init: address not 8-byte aligned");
  emu::check_smem(emu::g_smem + bar, 8, "mbarrier");
  if (count == 0) emu::fail("mbarrier.init: zero arrival count");
  emu::MBar b;
  b.count = b.pending = count;
  emu::g_mbars[bar] = b;
}

void emu_mbar_wait(unsigned bar, unsigned parity) {
  ++emu::g_progress;
  for (;;) {
    emu::MBar& b = emu::mbar(bar, "mbarrier.try_wait");
    if ((unsigned)(b.phase & 1) != parity) return;  // the phase of that parity completed
    if (!b.copies.empty()) {
      emu::land(b);  // the copy engine delivers while someone waits
      continue;
    }
    emu::yield();
  }
}

void emu_mbar_arrive(unsigned bar, unsigned tx_bytes) {
  emu::MBar& b = emu::mbar(bar, "mbarrier.arrive");
  if (b.pending == 0) emu::fail("mbarrier.arrive: more arrivals than the phase expects");
  b.tx += tx_bytes;
  --b.pending;
  ++emu::g_progress;
  emu::complete_phase_if_done(b);
}

void emu_tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
  emu::EmuMap m;
  std::memcpy(&m, map, sizeof m);
  if (m.magic != emu::kMapMagic) emu::fail("cp.async.bulk.tensor: not an emulator tensor map");
  if (dst % 128) emu::fail("cp.async.bulk.tensor: shared destination not 128-byte aligned");
  if (m.swizzle == 3 && dst % 1024)
    emu::fail("cp.async.bulk.tensor: 128B-swizzled destination not 1024-byte aligned");
  for (int d = 0; d < 3; ++d)
    if (m.box[d] < 1 || m.box[d] > 256) emu::fail("cp.async.bulk.tensor: box outside 1..256");
  if (m.swizzle == 3 && m.box[0] * m.esz > 128)
    emu::fail("cp.async.bulk.tensor: inner box wider than the 128-byte swizzle span");
  // the H200 raises an illegal instruction for an innermost coordinate that is not a
  // multiple of 16 bytes (measured: attention backward's varlen stats rows)
  if ((long long)c0 * (long long)m.esz % 16)
    emu::fail("cp.async.bulk.tensor: innermost coordinate not a multiple of 16 bytes");
  emu::MBar& b = emu::mbar(bar, "cp.async.bulk.tensor");
  const size_t bytes = m.box[0] * m.box[1] * m.box[2] * m.esz;
  emu::check_smem(emu::g_smem + dst, bytes, "cp.async.bulk.tensor destination");
  emu::TmaCopy copy;
  copy.dst = dst;
  copy.data.assign(bytes, 0);
  const long long c[3] = {c0, c1, c2};
  for (unsigned long long i2 = 0; i2 < m.box[2]; ++i2)
    for (unsigned long long i1 = 0; i1 < m.box[1]; ++i1)
      for (unsigned long long i0 = 0; i0 < m.box[0]; ++i0) {
        const long long g0 = c[0] + (long long)i0, g1 = c[1] + (long long)i1,
                        g2 = c[2] + (long long)i2;
        size_t lin = ((i2 * m.box[1] + i1) * m.box[0] + i0) * m.esz;
        if (m.swizzle == 3) {  // 16-byte chunk bits [4,7) ^= bits [7,10) of the address
          const size_t a = dst + lin;
          lin = (a ^ (((a >> 7) & 7) << 4)) - dst;
        }
        if (g0 < 0 || g1 < 0 || g2 < 0 || g0 >= (long long)m.dims[0] ||
            g1 >= (long long)m.dims[1] || g2 >= (long long)m.dims[2])
          continue;  // out of bounds: zero
        const unsigned char* src = (const unsigned char*)m.address + g0 * m.esz +
                                   g1 * m.strides[0] + g2 * m.strides[1];
        emu::check_global(src, m.esz, "cp.async.bulk.tensor source");
        std::memcpy(&copy.data[lin], src, m.esz);
      }
  for (size_t i = 0; i < bytes; ++i) {
    emu::Shadow& s = emu::g_shadow[dst + i];
    if (s.pending) emu::fail("cp.async.bulk.tensor: destination has a copy in flight");
    if (s.async_reads) emu::fail("cp.async.bulk.tensor: destination is read by a wgmma in flight");
    ++s.pending;
    s.unfenced = false;
  }
  b.copies.push_back(std::move(copy));
}

// The bulk reduction lands at issue (the emulator's copy engine is immediate): its shared
// source is read through the async proxy (no copy in flight, no unfenced generic write, no
// write in the current barrier interval), the global destination checked and added to.
void emu_bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  if (src % 16 || (uintptr_t)dst % 16 || bytes % 16)
    emu::fail("cp.reduce.async.bulk: address or size not a multiple of 16 bytes");
  emu::check_smem(emu::g_smem + src, bytes, "cp.reduce.async.bulk source");
  emu::check_global(dst, bytes, "cp.reduce.async.bulk destination");
  for (size_t i = 0; i < bytes; ++i) {
    const emu::Shadow& s = emu::g_shadow[src + i];
    if (s.pending) emu::fail("cp.reduce.async.bulk reads shared bytes with a copy in flight");
    if (s.unfenced)
      emu::fail("cp.reduce.async.bulk reads shared bytes written through the generic proxy "
                "without fence.proxy.async");
    if (s.w_epoch == emu::g_epoch)
      emu::fail("cp.reduce.async.bulk reads shared bytes written without a barrier between");
  }
  const float* v = reinterpret_cast<const float*>(emu::g_smem + src);
  for (unsigned i = 0; i < bytes / 4; ++i) dst[i] += v[i];
  ++emu::g_progress;
}

// bar.sync (wait) and bar.arrive (count, go on) share one barrier per id.
static emu::Bar& emu_named(int id, int threads, const char* what) {
  if (id < 1 || id > 15) emu::fail(std::string(what) + ": named barrier id outside 1..15");
  if (threads % 32) emu::fail(std::string(what) + ": thread count not a multiple of 32");
  auto it = emu::g_named_threads.find(id);
  if (it == emu::g_named_threads.end()) {
    emu::g_named_threads[id] = threads;
  } else if (it->second != threads) {
    emu::fail(std::string(what) + ": thread count differs between arrivals");
  }
  return emu::g_named[id];
}

void emu_named_sync(int id, int threads) {
  emu::Bar& b = emu_named(id, threads, "bar.sync");
  const long gen = b.gen;
  ++emu::g_progress;
  if (++b.count == threads) {
    b.count = 0;
    ++b.gen;
    ++emu::g_epoch;
  } else {
    while (b.gen == gen) emu::yield();
  }
}

void emu_named_arrive(int id, int threads) {
  emu::Bar& b = emu_named(id, threads, "bar.arrive");
  ++emu::g_progress;
  if (++b.count == threads) {
    b.count = 0;
    ++b.gen;
    ++emu::g_epoch;
  }
}

}  // namespace dnnctl
