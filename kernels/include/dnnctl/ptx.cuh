// dnnctl PTX primitives for the tensor-core kernels: cp.async, ldmatrix, mma.sync, tf32
// conversion, and plain global / shared accesses.
//
// Every shared-memory and global access of the GEMM-family kernels goes through these
// helpers. Built with -DDNNCTL_EMU (tools/cuda_emu), the same kernel source runs on a CPU
// emulator that checks bounds, pending cp.async groups and warp-collective semantics.
#pragma once
#include <dnnctl/common.cuh>

#ifdef DNNCTL_EMU
#include <dnnctl_emu_hooks.h>
#else

// Dynamic shared memory of the block (launch with shared_mem = the tile bytes).
#define DNNCTL_DECLARE_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
// An invariant the CPU emulator checks (compiled out on the GPU).
#define DNNCTL_EMU_CHECK(cond, msg) ((void)0)

namespace dnnctl {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Asynchronous global -> shared copy of BYTES (4, 8 or 16); when !pred the destination is
// zero-filled and nothing is read (src must still be a valid address: pass the base).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned s = smem_u32(dst);
  const int n = pred ? BYTES : 0;
  if (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src),
                 "n"(BYTES), "r"(n));
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. TRANS is "" or
// ".trans" (each matrix transposed on the way to the registers).
#define DNNCTL_LDMATRIX_X4(TRANS)                                                          \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4" TRANS ".shared.b16 {%0,%1,%2,%3}, [%4];\n" \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                           \
               : "r"(smem_u32(p)))

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  DNNCTL_LDMATRIX_X4("");
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  DNNCTL_LDMATRIX_X4(".trans");
}

// d += a * b on one m16n8 tile, row-major A / col-major B fragments, fp32 accumulate (d, a,
// b the callers' arrays); SHAPE_TYPES names the k depth and the input types.
#define DNNCTL_MMA_M16N8(SHAPE_TYPES)                                                      \
  asm volatile("mma.sync.aligned.m16n8" SHAPE_TYPES                                        \
               " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                  \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

// d += a * b, m16n8k16, fp16 or bf16 inputs.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          const unsigned (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[2]) {
  DNNCTL_MMA_M16N8("k16.row.col.f32.f16.f16.f32");
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                                         const unsigned (&b)[2]) {
  DNNCTL_MMA_M16N8("k16.row.col.f32.bf16.bf16.f32");
}

// d += a * b, m16n8k8 TF32 (a, b hold tf32 bit patterns from to_tf32).
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const unsigned (&a)[4],
                                              const unsigned (&b)[2]) {
  DNNCTL_MMA_M16N8("k8.row.col.f32.tf32.tf32.f32");
}

// fp32 -> tf32, round to nearest (ties away), as cuBLAS / cuDNN do.
__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

template <typename T>
__device__ __forceinline__ T lds(const void* p) { return *reinterpret_cast<const T*>(p); }

template <typename T>
__device__ __forceinline__ void sts(void* p, T v) { *reinterpret_cast<T*>(p) = v; }

template <typename T>
__device__ __forceinline__ T ldg(const T* p) { return *p; }

template <typename T>
__device__ __forceinline__ void stg(T* p, T v) { *p = v; }

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }

// Device-scope counter increment; returns the previous value.
__device__ __forceinline__ int atomic_inc(int* p) { return atomicAdd(p, 1); }

// Make this thread's global writes visible device-wide before its later writes.
__device__ __forceinline__ void fence_device() { __threadfence(); }

// Global load that bypasses L1 (data other blocks wrote during this launch).
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }

__device__ __forceinline__ void block_sync() { __syncthreads(); }

}  // namespace dnnctl
#endif  // DNNCTL_EMU

namespace dnnctl {

// Two adjacent 16-bit elements packed in one 32-bit register (low half = first).
template <typename T>
__device__ __forceinline__ unsigned pack2(T lo, T hi) {
  const unsigned short l = *reinterpret_cast<const unsigned short*>(&lo);
  const unsigned short h = *reinterpret_cast<const unsigned short*>(&hi);
  return static_cast<unsigned>(l) | (static_cast<unsigned>(h) << 16);
}

}  // namespace dnnctl
