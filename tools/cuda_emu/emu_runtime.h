// Implementation of the CUDA CPU emulator (included once, after the kernel source, by the
// harness that tools/cuda_emu/emu.py generates). x86-64 only (hand-written fiber switch).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <tuple>
#include <utility>

extern "C" void emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

namespace emu {

struct Bar {
  int count = 0;
  long gen = 0;
};

struct Shadow {  // per shared-memory byte
  int pending = 0;
  long w_epoch = -1, r_epoch = -1;
  int writer = -1, reader = -1;  // reader -2: several threads
  int async_reads = 0;    // wgmma ops in flight that read the byte
  bool unfenced = false;  // last written through the generic proxy, writer not yet fenced
};

constexpr size_t kStack = 512 * 1024;

inline std::vector<Fiber> g_fibers;
inline std::vector<Bar> g_warp_bars;
inline std::vector<unsigned char> g_warp_slots;
inline std::vector<Shadow> g_shadow;
inline Bar g_block_bar;
inline long g_epoch = 0;
inline long g_progress = 0;
inline void* g_sched_sp = nullptr;
inline std::string g_error;
inline std::function<void()> g_body;
inline std::mt19937 g_rng;
inline int g_block_threads = 0;  // threads of one block (a block barrier's count)
inline bool g_coop = false;      // the next launch is cooperative (emu_set_coop)

// A cooperative launch keeps every block's state; the scheduler swaps it in with the fiber.
struct BlockCtx {
  Dim3 idx{0, 0, 0};
  std::vector<unsigned char> smem;
  std::vector<Shadow> shadow;
  Bar bar;
  std::vector<Bar> warp_bars;
  std::vector<unsigned char> warp_slots;
  long epoch = 0;
};
inline std::vector<BlockCtx> g_blocks;
inline int g_cur_block = -1;

[[noreturn]] void fail(const std::string& what) {
  char where[160];
  std::snprintf(where, sizeof where, " [block (%u,%u,%u) thread %d]", g_block_idx.x,
                g_block_idx.y, g_block_idx.z, cur ? cur->linear : -1);
  throw Error(what + where);
}

void yield() { emu_switch(&cur->sp, g_sched_sp); }

void note_progress() { ++g_progress; }

void block_barrier() {
  Bar& b = g_block_bar;
  const long gen = b.gen;
  ++g_progress;
  if (++b.count == g_block_threads) {
    b.count = 0;
    ++b.gen;
    ++g_epoch;
  } else {
    while (b.gen == gen) yield();
  }
}

void warp_barrier() {
  Bar& b = g_warp_bars[cur->warp];
  const long gen = b.gen;
  ++g_progress;
  if (++b.count == 32) {
    b.count = 0;
    ++b.gen;
  } else {
    while (b.gen == gen) yield();
  }
}

void* warp_slot(int lane) { return &g_warp_slots[((size_t)cur->warp * 32 + lane) * 64]; }

void check_global(const void* p, size_t bytes, const char* what) {
  const unsigned char* q = (const unsigned char*)p;
  for (const Buffer& b : g_buffers)
    if (q >= b.lo && q + bytes <= b.lo + b.bytes) return;
  char msg[200];
  std::snprintf(msg, sizeof msg, "%s: %zu bytes at %p are outside every buffer", what, bytes, p);
  fail(msg);
}

unsigned char* check_smem(const void* p, size_t bytes, const char* what) {
  unsigned char* q = (unsigned char*)p;
  if (q < g_smem || q + bytes > g_smem + g_smem_bytes) {
    char msg[200];
    std::snprintf(msg, sizeof msg, "%s: shared offset %td (+%zu) outside %zu bytes", what,
                  q - g_smem, bytes, g_smem_bytes);
    fail(msg);
  }
  return q;
}

void smem_read(const void* p, size_t bytes, const char* what) {
  unsigned char* q = check_smem(p, bytes, what);
  for (size_t i = 0; i < bytes; ++i) {
    Shadow& s = g_shadow[(q - g_smem) + i];
    if (s.pending) fail(std::string(what) + ": reads shared bytes with a cp.async in flight");
    if (s.w_epoch == g_epoch && s.writer != cur->linear) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "%s: race: shared offset %td written by thread %d "
                    "without a barrier in between", what, (q - g_smem) + (ptrdiff_t)i, s.writer);
      fail(msg);
    }
    if (s.r_epoch != g_epoch) {
      s.r_epoch = g_epoch;
      s.reader = cur->linear;
    } else if (s.reader != cur->linear) {
      s.reader = -2;
    }
  }
}

void smem_write(const void* p, size_t bytes, const char* what) {
  unsigned char* q = check_smem(p, bytes, what);
  cur->unfenced.push_back({(size_t)(q - g_smem), bytes});
  for (size_t i = 0; i < bytes; ++i) {
    Shadow& s = g_shadow[(q - g_smem) + i];
    if (s.pending) fail(std::string(what) + ": writes shared bytes with a cp.async in flight");
    if (s.async_reads)
      fail(std::string(what) + ": writes shared bytes a wgmma in flight still reads");
    s.unfenced = true;
    if (s.r_epoch == g_epoch && s.reader != cur->linear) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "%s: race: shared offset %td read by thread %d in the "
                    "same barrier interval", what, (q - g_smem) + (ptrdiff_t)i, s.reader);
      fail(msg);
    }
    if (s.w_epoch == g_epoch && s.writer != cur->linear)
      fail(std::string(what) + ": race: two threads write one shared byte");
    s.w_epoch = g_epoch;
    s.writer = cur->linear;
  }
}

void mark_pending(const void* p, size_t bytes) {
  const size_t off = (const unsigned char*)p - g_smem;
  for (size_t i = 0; i < bytes; ++i) ++g_shadow[off + i].pending;
}

static void complete(const Copy& c) {
  cur->unfenced.push_back({(size_t)(c.dst - g_smem), (size_t)c.bytes});
  for (int i = 0; i < c.bytes; ++i) {
    Shadow& s = g_shadow[(c.dst - g_smem) + i];
    --s.pending;
    s.w_epoch = g_epoch;  // lands now: readers need a barrier after this wait
    s.writer = cur->linear;
    s.unfenced = true;  // a generic-proxy write (wgmma needs fence.proxy.async first)
  }
  if (c.valid) std::memcpy(c.dst, c.src, c.valid);
  if (c.valid < c.bytes) std::memset(c.dst + c.valid, 0, c.bytes - c.valid);
}

}  // namespace emu

namespace dnnctl {

void emu_cp_async_commit() { emu::cur->group_ends.push_back(emu::cur->pending.size()); }

void emu_cp_async_wait(int n) {
  emu::Fiber* f = emu::cur;
  // groups beyond the newest n complete; uncommitted copies are not waited on (as in PTX)
  const int groups = (int)f->group_ends.size();
  if (groups <= n) return;
  const size_t upto = f->group_ends[groups - n - 1];
  for (size_t i = 0; i < upto; ++i) emu::complete(f->pending[i]);
  f->pending.erase(f->pending.begin(), f->pending.begin() + upto);
  std::vector<size_t> rest;
  for (int g = groups - n; g < groups; ++g) rest.push_back(f->group_ends[g] - upto);
  f->group_ends = rest;
}

static float half_at(const unsigned* regs, int reg, int h, int kind) {
  const unsigned short bits = (unsigned short)(regs[reg] >> (16 * h));
  if (kind == 1) {
    const unsigned u = (unsigned)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half x;
  std::memcpy(&x, &bits, 2);
  return __half2float(x);
}

void emu_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], int kind) {
  const int lane = emu::cur->lane;
  unsigned* mine = (unsigned*)emu::warp_slot(lane);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  emu::warp_barrier();
  const int g = lane >> 2, t = lane & 3;
  float out[4];
  for (int v = 0; v < 4; ++v) {
    const int r = g + 8 * (v >> 1), n = 2 * t + (v & 1);
    float sum = d[v];
    if (kind < 2) {
      for (int k = 0; k < 16; ++k) {
        const unsigned* la = (const unsigned*)emu::warp_slot((r % 8) * 4 + (k % 8) / 2);
        const unsigned* lb = (const unsigned*)emu::warp_slot(n * 4 + (k % 8) / 2);
        const float av = half_at(la, (r / 8) + 2 * (k / 8), k % 2, kind);
        const float bv = half_at(lb + 4, k / 8, k % 2, kind);
        sum = fmaf(av, bv, sum);
      }
    } else {
      for (int k = 0; k < 8; ++k) {
        const unsigned* la = (const unsigned*)emu::warp_slot((r % 8) * 4 + k % 4);
        const unsigned* lb = (const unsigned*)emu::warp_slot(n * 4 + k % 4);
        unsigned ua = la[(r / 8) + 2 * (k / 4)] & 0xffffe000u;
        unsigned ub = lb[4 + k / 4] & 0xffffe000u;
        float av, bv;
        std::memcpy(&av, &ua, 4);
        std::memcpy(&bv, &ub, 4);
        sum = fmaf(av, bv, sum);
      }
    }
    out[v] = sum;
  }
  emu::warp_barrier();
  for (int v = 0; v < 4; ++v) d[v] = out[v];
}

void emu_ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans) {
  if ((uintptr_t)p % 16) emu::fail("ldmatrix: row address not 16-byte aligned");
  emu::smem_read(p, 16, "ldmatrix");
  const int lane = emu::cur->lane;
  *(const unsigned char**)emu::warp_slot(lane) = (const unsigned char*)p;
  emu::warp_barrier();
  auto row = [](int l) { return *(const unsigned char**)emu::warp_slot(l); };
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      std::memcpy(&r[i], row(8 * i + lane / 4) + 4 * (lane % 4), 4);
    } else {
      unsigned short lo, hi;
      std::memcpy(&lo, row(8 * i + 2 * (lane % 4)) + 2 * (lane / 4), 2);
      std::memcpy(&hi, row(8 * i + 2 * (lane % 4) + 1) + 2 * (lane / 4), 2);
      r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
  }
  emu::warp_barrier();
}

}  // namespace dnnctl

namespace emu {

static void fiber_main() {
  Fiber* f = cur;
  try {
    g_body();
    if (!f->pending.empty()) fail("thread exited with cp.async copies never waited on");
    if (!f->wg_ops.empty()) fail("thread exited with wgmma ops never waited on");
  } catch (const std::exception& e) {
    if (g_error.empty()) g_error = e.what();
  }
  f->done = true;
  ++g_progress;
  emu_switch(&f->sp, g_sched_sp);
  std::abort();  // never resumed
}

static void init_fiber(Fiber& f) {
  unsigned char* top = f.stack + kStack;  // 16-byte aligned
  uint64_t* sp = (uint64_t*)(top - 72);
  sp[0] = 0x1f80ull | (0x037full << 32);  // mxcsr, x87 control word
  for (int i = 1; i <= 6; ++i) sp[i] = 0;  // r15 r14 r13 r12 rbx rbp
  sp[7] = (uint64_t)(void*)&fiber_main;
  sp[8] = 0;  // fake return address of fiber_main
  f.sp = sp;
  f.done = false;
  f.pending.clear();
  f.group_ends.clear();
  f.wg_ops.clear();
  f.wg_group_ends.clear();
  f.wg_fenced = false;
  f.unfenced.clear();
}

inline void tma_block_reset();
inline void tma_block_end();

// Make block b's state the current one (cooperative launches).
static void switch_block(int b) {
  if (b == g_cur_block) return;
  if (g_cur_block >= 0) {
    BlockCtx& o = g_blocks[g_cur_block];
    o.shadow.swap(g_shadow);
    o.warp_bars.swap(g_warp_bars);
    o.warp_slots.swap(g_warp_slots);
    o.bar = g_block_bar;
    o.epoch = g_epoch;
  }
  BlockCtx& n = g_blocks[b];
  n.shadow.swap(g_shadow);
  n.warp_bars.swap(g_warp_bars);
  n.warp_slots.swap(g_warp_slots);
  g_block_bar = n.bar;
  g_epoch = n.epoch;
  g_block_idx = n.idx;
  g_smem = n.smem.data();
  g_cur_block = b;
}

// Run the first n fibers to completion in a random order per round (a cooperative launch:
// each fiber's block state swapped in first); a round in which no live fiber got further is
// a deadlock.
static void schedule(int n, bool coop) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  int alive = n;
  while (alive > 0) {
    std::shuffle(order.begin(), order.end(), g_rng);
    const long before = g_progress;
    for (int i : order) {
      Fiber& f = g_fibers[i];
      if (f.done) continue;
      if (coop) switch_block(f.block);
      cur = &f;
      emu_switch(&g_sched_sp, f.sp);
      if (!g_error.empty()) throw Error(g_error);
      if (f.done) --alive;
    }
    cur = nullptr;
    if (alive > 0 && g_progress == before)
      throw Error("deadlock: every live thread waits at a barrier the others never reach");
  }
}

static void run_block() {
  const int n = (int)g_fibers.size();
  tma_block_reset();
  for (Fiber& f : g_fibers) init_fiber(f);
  g_block_bar = Bar();
  for (Bar& b : g_warp_bars) b = Bar();
  std::fill(g_shadow.begin(), g_shadow.end(), Shadow());
  for (size_t i = 0; i < g_smem_bytes; ++i) g_smem[i] = (unsigned char)(g_rng() | 0x80);
  g_epoch = 0;
  schedule(n, false);
  tma_block_end();
  if (!g_error.empty()) throw Error(g_error);
}

// Every block's threads as fibers of one schedule (a cooperative launch: all blocks are
// resident together, as cuLaunchCooperativeKernel guarantees).
static void run_coop(const unsigned* grid, int nthreads, size_t smem) {
  const int nblocks = (int)(grid[0] * grid[1] * grid[2]);
  const int total = nblocks * nthreads;
  if (total > 8192) throw Error("a cooperative launch of more than 8192 threads is too big here");
  if (g_fibers.size() != (size_t)total) {
    for (Fiber& f : g_fibers) std::free(f.stack);
    g_fibers.assign(total, Fiber());
    for (Fiber& f : g_fibers) f.stack = (unsigned char*)std::aligned_alloc(64, kStack);
  }
  g_blocks.assign(nblocks, BlockCtx());
  for (int k = 0; k < nblocks; ++k) {
    BlockCtx& c = g_blocks[k];
    c.idx = {(unsigned)(k % grid[0]), (unsigned)((k / grid[0]) % grid[1]),
             (unsigned)(k / (grid[0] * grid[1]))};
    c.smem.resize(smem + 1);
    for (size_t i = 0; i < smem; ++i) c.smem[i] = (unsigned char)(g_rng() | 0x80);
    c.shadow.assign(smem + 1, Shadow());
    c.warp_bars.assign(nthreads / 32, Bar());
    c.warp_slots.assign((size_t)nthreads * 64, 0);
  }
  for (int i = 0; i < total; ++i) {
    Fiber& f = g_fibers[i];
    const int t = i % nthreads;
    f.block = i / nthreads;
    f.linear = t;
    f.tid = {(unsigned)(t % g_block_dim.x), (unsigned)((t / g_block_dim.x) % g_block_dim.y),
             (unsigned)(t / (g_block_dim.x * g_block_dim.y))};
    f.warp = t / 32;
    f.lane = t % 32;
    init_fiber(f);
  }
  g_cur_block = -1;
  g_shadow.clear();
  g_warp_bars.clear();
  g_warp_slots.clear();
  switch_block(0);
  tma_block_reset();
  schedule(total, true);
  tma_block_end();
  g_cur_block = -1;
  g_blocks.clear();
  if (!g_error.empty()) throw Error(g_error);
}

inline int run_grid(const unsigned* grid, const unsigned* block, size_t smem, unsigned seed) {
  const int nthreads = (int)(block[0] * block[1] * block[2]);
  if (nthreads % 32) throw Error("block size must be a multiple of 32 here");
  g_block_threads = nthreads;
  g_rng.seed(seed);
  g_grid_dim = {grid[0], grid[1], grid[2]};
  g_block_dim = {block[0], block[1], block[2]};
  if (g_coop) {
    g_coop = false;
    g_smem_bytes = smem;
    run_coop(grid, nthreads, smem);
    g_smem = nullptr;
    return 0;
  }
  std::vector<unsigned char> smem_buf(smem + 1);
  g_smem = smem_buf.data();
  g_smem_bytes = smem;
  g_shadow.assign(smem + 1, Shadow());
  if (g_fibers.size() != (size_t)nthreads) {
    for (Fiber& f : g_fibers) std::free(f.stack);
    g_fibers.assign(nthreads, Fiber());
    for (Fiber& f : g_fibers) f.stack = (unsigned char*)std::aligned_alloc(64, kStack);
  }
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = g_fibers[t];
    f.block = 0;
    f.linear = t;
    f.tid = {(unsigned)(t % block[0]), (unsigned)((t / block[0]) % block[1]),
             (unsigned)(t / (block[0] * block[1]))};
    f.warp = t / 32;
    f.lane = t % 32;
  }
  g_warp_bars.assign(nthreads / 32, Bar());
  g_warp_slots.assign((size_t)nthreads * 64, 0);
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        g_block_idx = {x, y, z};
        run_block();
      }
  g_smem = nullptr;
  return 0;
}

template <typename... A, size_t... I>
static std::tuple<A...> unpack(void** args, std::index_sequence<I...>) {
  return std::tuple<A...>(*reinterpret_cast<A*>(args[I])...);
}

// Launch kernel k: argument count and byte sizes must match its signature exactly (CuPy
// packs arguments by their Python types, so a mismatch would be garbage on the GPU too).
template <typename... A>
int launch(void (*k)(A...), const unsigned* grid, const unsigned* block, size_t smem,
           void** args, const size_t* sizes, int nargs, const void* const* bufs,
           const size_t* buf_bytes, int nbufs, unsigned seed, char* err, size_t errlen) {
  g_error.clear();
  try {
    if (nargs != (int)sizeof...(A))
      throw Error("kernel takes " + std::to_string(sizeof...(A)) + " arguments, got " +
                  std::to_string(nargs));
    const size_t want[] = {sizeof(A)...};
    for (int i = 0; i < nargs; ++i)
      if (sizes[i] != want[i])
        throw Error("argument " + std::to_string(i) + " has " + std::to_string(sizes[i]) +
                    " bytes, the kernel expects " + std::to_string(want[i]));
    g_buffers.clear();
    for (int i = 0; i < nbufs; ++i)
      g_buffers.push_back({(const unsigned char*)bufs[i], buf_bytes[i]});
    std::tuple<A...> vals = unpack<A...>(args, std::index_sequence_for<A...>());
    g_body = [&]() { std::apply(k, vals); };
    run_grid(grid, block, smem, seed);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return 1;
  }
}

}  // namespace emu

// The next launch of this library runs every block together (a cooperative launch).
extern "C" void emu_set_coop(int on) { emu::g_coop = on != 0; }

#include "emu_wgmma_runtime.h"
#include "emu_tma_runtime.h"
