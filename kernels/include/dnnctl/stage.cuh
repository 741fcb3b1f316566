// Staging global -> shared memory for the memory-bound kernels that keep a whole working set
// (a row, a group, a pooling patch) in shared memory: every copy of a thread is issued before
// any is waited on (cp.async), so a block has all of its bytes in flight at once instead of
// one load per loop trip, and no registers hold them on the way.
#pragma once
#include <dnnctl/memory.cuh>
#include <dnnctl/ptx.cuh>

namespace dnnctl {

// Copy one vector of VEC elements without waiting: cp.async for 4-, 8- and 16-byte vectors,
// a plain load and store for 2-byte ones (cp.async has no 2-byte form). Both addresses are
// aligned to the vector's size.
template <int VEC>
__device__ __forceinline__ void stage_vec(elem_t* dst, const elem_t* src) {
  constexpr int CHUNK = VEC * (int)sizeof(elem_t);
  if constexpr (CHUNK > 16) {  // (wider than one access: 16-byte pieces)
    constexpr int PER = 16 / (int)sizeof(elem_t);
#pragma unroll
    for (int c = 0; c < VEC / PER; ++c) cp_async<16>(dst + c * PER, src + c * PER, true);
  } else if constexpr (CHUNK >= 4) {
    cp_async<CHUNK>(dst, src, true);
  } else {
    typedef typename Bits<CHUNK>::type B;
    st_bits<ST_PLAIN>(reinterpret_cast<B*>(dst), ld_bits<LD_NC>(reinterpret_cast<const B*>(src)));
  }
}

// Wait for all of this thread's staged copies (other threads' copies need a barrier too).
__device__ __forceinline__ void stage_wait() {
  cp_async_commit();
  cp_async_wait<0>();
}

// A row of nv vectors: thread t copies vectors t, t + BLOCK, ... and waits for them; a kernel
// that reads back only those vectors needs no barrier.
template <int BLOCK, int VEC>
__device__ __forceinline__ void stage_row(elem_t* buf, const elem_t* src, int nv) {
  for (int k = threadIdx.x; k < nv; k += BLOCK) stage_vec<VEC>(buf + k * VEC, src + k * VEC);
  stage_wait();
}

}  // namespace dnnctl
