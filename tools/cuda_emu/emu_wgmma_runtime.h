// Implementation of the emulated wgmma primitives (dnnctl_emu_wgmma.h); included at the end
// of emu_runtime.h. Descriptor decoding follows PTX ISA 9.7.15.5.1.2 (canonical layouts with
// 128-byte swizzling: byte address bits [4,7) ^= bits [7,10)) and 9.7.15.5.1.2.2 (descriptor
// bit fields); the accumulator fragment is that of 9.7.15.5.1.1.1.
#pragma once

namespace dnnctl {

// Shared offset of element (mn, k) of a wgmma operand: mn is M (for A) or N (for B), k in
// [0, 16). K-major: ((8,m),(T,2k)):((8T,SBO),(1,T)); MN-major: ((T,8,m),(8,k)):((1,T,LBO),
// (8T,SBO)), T = 8 sixteen-bit elements, then Swizzle<3,4,3> on the byte address.
static size_t emu_wg_offset(unsigned long long desc, bool mn_major, int mn, int k) {
  const size_t start = (size_t)(desc & 0x3FFFull) << 4;
  const size_t lbo = (size_t)((desc >> 16) & 0x3FFFull) << 4;
  const size_t sbo = (size_t)((desc >> 32) & 0x3FFFull) << 4;
  size_t lin;
  if (mn_major) {
    lin = start + (size_t)(mn % 64) * 2 + (size_t)(mn / 64) * lbo + (size_t)(k % 8) * 128 +
          (size_t)(k / 8) * sbo;
  } else {
    lin = start + (size_t)(mn % 8) * 128 + (size_t)(mn / 8) * sbo + (size_t)(k % 8) * 2 +
          (size_t)(k / 8) * 16;
  }
  return lin ^ (((lin >> 7) & 7) << 4);
}

static void emu_wg_check_desc(unsigned long long desc, const char* which) {
  const unsigned long long reserved = (3ull << 14) | (3ull << 30) | (7ull << 46) |
                                      (0x3FFull << 52);
  if (desc & reserved) emu::fail(std::string("wgmma: reserved bits set in descriptor ") + which);
  if ((desc >> 62) != 1)
    emu::fail(std::string("wgmma: descriptor ") + which + " is not 128-byte swizzled "
              "(only that mode is emulated)");
  if ((desc >> 49) & 7)
    emu::fail(std::string("wgmma: descriptor ") + which + " has a base offset (the kernels "
              "keep swizzle atoms 1024-byte aligned)");
}

// One 16-bit operand element, read the way the async proxy would: the byte must have no
// cp.async in flight, no write since the last barrier, and no unfenced generic write.
static float emu_wg_load(size_t off, int bf16, emu::WgOp& op) {
  unsigned char* q = emu::check_smem(emu::g_smem + off, 2, "wgmma operand");
  if (off % 2) emu::fail("wgmma operand: misaligned element");
  for (size_t i = 0; i < 2; ++i) {
    emu::Shadow& s = emu::g_shadow[off + i];
    if (s.pending) emu::fail("wgmma reads shared bytes with a cp.async in flight");
    if (s.w_epoch == emu::g_epoch) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "wgmma reads shared offset %zu written by thread %d "
                    "without a barrier in between", off + i, s.writer);
      emu::fail(msg);
    }
    if (s.unfenced) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "wgmma reads shared offset %zu that thread %d wrote "
                    "through the generic proxy without fence.proxy.async", off + i, s.writer);
      emu::fail(msg);
    }
    ++s.async_reads;
    op.reads.push_back(off + i);
  }
  unsigned short bits;
  std::memcpy(&bits, q, 2);
  if (bf16) {
    const unsigned u = (unsigned)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half h;
  std::memcpy(&h, &bits, 2);
  return __half2float(h);
}

void emu_fence_proxy_async() {
  emu::Fiber* f = emu::cur;
  for (const auto& r : f->unfenced)
    for (size_t i = 0; i < r.second; ++i) {
      emu::Shadow& s = emu::g_shadow[r.first + i];
      if (s.writer == f->linear && !s.pending) s.unfenced = false;
    }
  f->unfenced.clear();
}

void emu_wgmma_fence() { emu::cur->wg_fenced = true; }

void emu_wgmma_commit() {
  emu::cur->wg_group_ends.push_back(emu::cur->wg_ops.size());
  emu::cur->wg_fenced = false;
}

void emu_wgmma_wait(int n) {
  emu::Fiber* f = emu::cur;
  const int groups = (int)f->wg_group_ends.size();
  if (groups <= n) return;
  const size_t upto = f->wg_group_ends[groups - n - 1];
  for (size_t i = 0; i < upto; ++i) {
    emu::WgOp& op = f->wg_ops[i];
    for (size_t j = 0; j < op.prod.size(); ++j)
      op.d[j] = (op.accumulate ? op.d[j] : 0.f) + op.prod[j];
    for (size_t off : op.reads) --emu::g_shadow[off].async_reads;
  }
  f->wg_ops.erase(f->wg_ops.begin(), f->wg_ops.begin() + upto);
  std::vector<size_t> rest;
  for (int g = groups - n; g < groups; ++g) rest.push_back(f->wg_group_ends[g] - upto);
  f->wg_group_ends = rest;
}

// The checks every wgmma makes at issue.
static void emu_wg_issue_checks() {
  if (emu::g_block_dim.x * emu::g_block_dim.y * emu::g_block_dim.z % 128)
    emu::fail("wgmma: the block is not made of whole warpgroups");
  if (!emu::cur->wg_fenced) emu::fail("wgmma.mma_async without wgmma.fence since the last commit");
}

// Queue this thread's share of D (+)= A B: its two A rows (a[h][k], h = row / 8 of the warp's
// 16, k < 16) against its n / 4 columns of B read through descriptor db; the products land
// in d at the wait (emu_wgmma_wait).
static void emu_wg_queue(float* d, int n, const float (&a)[2][16], unsigned long long db,
                         int scale_d, int trans_b, int bf16, emu::WgOp& op) {
  const int lane = emu::cur->lane;
  op.d = d;
  op.accumulate = scale_d != 0;
  std::vector<float> b((size_t)(n / 4) * 16);  // this thread's n / 4 columns
  for (int i = 0; i < n / 8; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 16; ++k)
        b[(size_t)(2 * i + j) * 16 + k] =
            emu_wg_load(emu_wg_offset(db, trans_b != 0, 8 * i + 2 * (lane % 4) + j, k), bf16,
                        op);
  op.prod.assign((size_t)n / 2, 0.f);
  for (int i = 0; i < n / 8; ++i)
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 2; ++j) {
        float sum = 0.f;
        for (int k = 0; k < 16; ++k) sum = fmaf(a[h][k], b[(size_t)(2 * i + j) * 16 + k], sum);
        op.prod[(size_t)4 * i + 2 * h + j] = sum;
      }
  emu::cur->wg_ops.push_back(std::move(op));
}

void emu_wgmma(float* d, int n, unsigned long long da, unsigned long long db, int scale_d,
               int trans_a, int trans_b, int bf16) {
  emu_wg_issue_checks();
  emu_wg_check_desc(da, "A");
  emu_wg_check_desc(db, "B");
  const int w = (emu::cur->linear >> 5) & 3, lane = emu::cur->lane;
  emu::WgOp op;
  float a[2][16];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k)
      a[h][k] = emu_wg_load(emu_wg_offset(da, trans_a != 0, 16 * w + lane / 4 + 8 * h, k),
                            bf16, op);
  emu_wg_queue(d, n, a, db, scale_d, trans_b, bf16, op);
}

// Register-A form: the warp's 16 x 16 A slice is gathered from the four .b32 registers of
// every lane (the m16n8k16 A fragment: lane 4 g + t holds rows g and g + 8, columns 2 t, 2 t
// + 1 and + 8), read at issue as the hardware reads registers; B as in emu_wgmma.
void emu_wgmma_rs(float* d, int n, const unsigned* a, unsigned long long db, int scale_d,
                  int trans_b, int bf16) {
  emu_wg_issue_checks();
  emu_wg_check_desc(db, "B");
  const int lane = emu::cur->lane;
  unsigned* mine = (unsigned*)emu::warp_slot(lane);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  emu::warp_barrier();
  float av[2][16];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k) {
      const unsigned* la = (const unsigned*)emu::warp_slot((lane / 4) * 4 + (k % 8) / 2);
      av[h][k] = half_at(la, h + 2 * (k / 8), k % 2, bf16);
    }
  emu::warp_barrier();
  emu::WgOp op;
  emu_wg_queue(d, n, av, db, scale_d, trans_b, bf16, op);
}

}  // namespace dnnctl
