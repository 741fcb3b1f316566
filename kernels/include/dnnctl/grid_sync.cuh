// A grid-wide barrier for kernels launched cooperatively (cuLaunchCooperativeKernel: every
// block is resident at once, or the launch fails; dnnctl.backends.cuda.launch(...,
// cooperative=True)).
//
// One 64-bit counter in global memory that only grows: each block adds 1 on arrival and
// waits until the counter reaches the next multiple of the grid's block count. Every block
// of a launch passes the same barriers, so launch after launch (and barrier after barrier)
// the targets stay multiples of that count: the counter is zeroed once, when its workspace
// is made, never reset. Launches that share a counter must not overlap (one stream).
//
// Memory: the block's writes before the barrier are ordered by __syncthreads and thread 0's
// __threadfence (release) before its arrival; thread 0's acquire load of the counter, a
// fence and __syncthreads order the block's reads after it. Data other blocks wrote must
// be read with coherent loads (__ldcg or plain), never the read-only path (__ldg).
//
// The CPU emulator (tools/cuda_emu) runs a cooperative launch's blocks as fibers of one
// schedule; a waiting thread yields there.
#pragma once

namespace dnnctl {

__device__ __forceinline__ void grid_sync(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const unsigned long long blocks =
        (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
#ifdef DNNCTL_EMU
    const unsigned long long old = *counter;
    *counter = old + 1ull;
    emu::note_progress();
    const unsigned long long target = (old / blocks + 1ull) * blocks;
    while (*(volatile unsigned long long*)counter < target) emu::yield();
#else
    __threadfence();
    const unsigned long long old = atomicAdd(counter, 1ull);
    const unsigned long long target = (old / blocks + 1ull) * blocks;
    unsigned long long seen;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(counter) : "memory");
    } while (seen < target);
    __threadfence();
#endif
  }
  __syncthreads();
}

}  // namespace dnnctl
