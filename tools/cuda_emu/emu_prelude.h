// CPU emulation of the CUDA subset the dnnctl GEMM-family kernels use (force-included
// with g++ -include before a kernel .cu; see tools/cuda_emu/emu.py).
//
// Each CUDA thread of a block is a fiber; blocks run one after another (a cooperative launch:
// every block's threads together, so a grid-wide barrier can be waited on). Warp-collective
// operations (ldmatrix, mma.sync) exchange operands between the 32 lanes of a warp through
// a warp barrier. Shared memory has a shadow that catches reads of bytes with a cp.async in
// flight and same-interval races between threads (no __syncthreads between a write and a
// read / write of another thread). Global accesses are checked against the launch's
// buffers.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#undef __device__
#undef __global__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#undef __restrict__
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define __restrict__ __restrict

using std::max;
using std::min;

#define __expf(x) expf(x)  // CUDA's fast exp; glibc declares but does not export __expf
// a product rounded once, never contracted into an FMA (x86-64 without -mfma never fuses)
inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {

struct Dim3 {
  unsigned x, y, z;
};

struct Copy {  // one pending cp.async
  unsigned char* dst;
  const unsigned char* src;
  int bytes;  // cp-size
  int valid;  // src-size (rest zero-filled)
};

struct WgOp {  // one wgmma.mma_async in flight (tools/cuda_emu/emu_wgmma_runtime.h)
  float* d;                      // the issuing thread's accumulator registers
  std::vector<float> prod;       // its fragment of A * B, added when the group completes
  bool accumulate;               // scale-d
  std::vector<size_t> reads;     // shared offsets of the operand bytes the op reads
};

struct Fiber {
  void* sp = nullptr;
  unsigned char* stack = nullptr;
  bool done = false;
  Dim3 tid{0, 0, 0};
  int linear = 0, warp = 0, lane = 0;
  int block = 0;  // the block's index in a cooperative launch's list (else 0)
  std::vector<Copy> pending;
  std::vector<size_t> group_ends;  // pending.size() at each commit
  // wgmma state: ops in flight, wg_ops.size() at each commit_group, a wgmma.fence since
  // the last commit, and this thread's generic shared writes not yet fence.proxy.async'ed
  std::vector<WgOp> wg_ops;
  std::vector<size_t> wg_group_ends;
  bool wg_fenced = false;
  std::vector<std::pair<size_t, size_t>> unfenced;
};

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Buffer {
  const unsigned char* lo;
  size_t bytes;
};

// per-launch / per-block state (one launch at a time; single-threaded)
inline Fiber* cur = nullptr;
inline Dim3 g_block_idx{0, 0, 0}, g_block_dim{1, 1, 1}, g_grid_dim{1, 1, 1};
inline unsigned char* g_smem = nullptr;
inline size_t g_smem_bytes = 0;
inline std::vector<Buffer> g_buffers;

void yield();
void note_progress();  // a grid-barrier arrival (tools/cuda_emu: cooperative launches)
void block_barrier();
void warp_barrier();
[[noreturn]] void fail(const std::string& what);
void check_global(const void* p, size_t bytes, const char* what);
unsigned char* check_smem(const void* p, size_t bytes, const char* what);
void smem_read(const void* p, size_t bytes, const char* what);
void smem_write(const void* p, size_t bytes, const char* what);
void mark_pending(const void* p, size_t bytes);
void* warp_slot(int lane);  // 64 bytes of exchange space per lane of the current warp

}  // namespace emu

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::g_block_idx)
#define blockDim (emu::g_block_dim)
#define gridDim (emu::g_grid_dim)
