// dnnctl Hopper warpgroup MMA primitives (sm_90a): wgmma.mma_async m64nNk16 with fp16 / bf16
// operands in shared memory and fp32 accumulators, the matrix descriptors of the 128-byte
// swizzled layouts, wgmma.fence / commit_group / wait_group and the async-proxy fence.
//
// PTX ISA (8.0 and later), "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
//   9.7.15.5.1.2       Shared Memory Matrix Layout: swizzle atoms; K-major when imm-trans-a/b
//                      is 0, MN-major when it is 1 (transpose only for .f16 / .bf16).
//   9.7.15.5.1.2.1     Leading / stride dimension byte offsets (LBO / SBO):
//                        K-major, swizzled:  LBO unused ("assumed 1"), SBO = 8 rows -> next 8
//                        MN-major, swizzled: LBO = first (128/16 = 8) 128-bit rows along MN
//                        -> the next 8, i.e. 64 16-bit elements of M or N; SBO = 8 columns of
//                        K -> the next 8.
//   9.7.15.5.1.2.1.3   Canonical layouts (CuTe notation, T = 8 elements of 16 bits):
//                        K-major 128B:  Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T))
//                        MN-major 128B: Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))
//                      Swizzle<3,4,3> acts on byte addresses: bits [4,7) ^= bits [7,10), i.e.
//                      the 16-byte chunk index inside a 128-byte row is XORed with the row
//                      index inside an 8-row (1024-byte) atom.
//   9.7.15.5.1.2.2     Matrix descriptor: bits 0-13 start address, 16-29 LBO, 32-45 SBO
//                      (each encoded as (x & 0x3FFFF) >> 4), 49-51 base offset (0: atoms
//                      start on 1024-byte boundaries), 62-63 swizzle (1 = 128-byte).
//   9.7.15.5.2         wgmma.mma_async: D = A * B + D (scale-d true) over the warpgroup.
//   9.7.15.5.1.1.1     Accumulator fragment of m64nNk16 (f32): thread t of the warpgroup,
//                      warp w = t / 32, lane l: d[4 i + 2 h + j] is element
//                      (16 w + l / 4 + 8 h, 8 i + 2 (l % 4) + j) for h, j in {0, 1}.
//   9.7.15.6           wgmma.fence (before the first wgmma and after touching accumulators),
//                      wgmma.commit_group, wgmma.wait_group N.
//   9.7.12.x (membar)  fence.proxy.async: wgmma reads shared memory through the async proxy,
//                      so data written by st.shared / cp.async (generic proxy) must be fenced
//                      by the writing thread before a barrier makes it visible to wgmma.
//
// Built with -DDNNCTL_EMU the same names run on the CPU emulator (tools/cuda_emu), which
// decodes the descriptors by the canonical layouts above and checks the async rules.
#pragma once
#include <dnnctl/ptx.cuh>

namespace dnnctl {

// 64-bit matrix descriptor of a 128-byte swizzled operand at shared address `saddr`.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr, unsigned lbo,
                                                      unsigned sbo) {
  const unsigned long long enc_a = (saddr & 0x3FFFFu) >> 4;
  const unsigned long long enc_l = (lbo & 0x3FFFFu) >> 4;
  const unsigned long long enc_s = (sbo & 0x3FFFFu) >> 4;
  return enc_a | (enc_l << 16) | (enc_s << 32) | (1ull << 62);
}

// The block's dynamic shared memory, rounded up to the 1024-byte boundary the swizzle atoms
// need (descriptor base offset 0); the kernels' shared-memory sizes include the
// 1 KB slack.
__device__ __forceinline__ unsigned char* wg_align_smem(unsigned char* raw) {
  const unsigned a = smem_u32(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

template <typename T>
struct WgIsBf16 {
  static constexpr bool value = false;
};
template <>
struct WgIsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

}  // namespace dnnctl

#ifdef DNNCTL_EMU
#include <dnnctl_emu_wgmma.h>
#else

namespace dnnctl {

// Order this thread's generic-proxy shared-memory writes (st.shared, completed cp.async)
// before later async-proxy accesses (wgmma operand reads) once a barrier follows.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most N of this warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads / writes across the asynchronous wgmma
// statements (the register is "used and redefined" here, at this point of the program).
__device__ __forceinline__ void wg_fence_acc(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d (N / 2 fp32 per thread) += A (64 x 16, descriptor da) * B (16 x N, descriptor db);
// TA / TB = 1: that operand is MN-major. scale_d = 0 overwrites d instead.
// Accumulator register lists, shared by both forms, each N's extending the one before:
// DNNCTL_WG_REGS_N is the "%0, .., %(N/2 - 1)" of the asm template, DNNCTL_WG_OUT_N the
// matching "+f" operands d[0 .. N/2 - 1].
#define DNNCTL_WG_REGS_16  \
  "%0, %1, %2, %3, %4, %5, %6, %7"
#define DNNCTL_WG_OUT_16  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define DNNCTL_WG_REGS_32  \
  DNNCTL_WG_REGS_16  \
  ", %8, %9, %10, %11, %12, %13, %14, %15"
#define DNNCTL_WG_OUT_32  \
  DNNCTL_WG_OUT_16,  \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define DNNCTL_WG_REGS_64  \
  DNNCTL_WG_REGS_32  \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DNNCTL_WG_OUT_64  \
  DNNCTL_WG_OUT_32,  \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DNNCTL_WG_REGS_128  \
  DNNCTL_WG_REGS_64  \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"  \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DNNCTL_WG_OUT_128  \
  DNNCTL_WG_OUT_64,  \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define DNNCTL_WG_REGS_256  \
  DNNCTL_WG_REGS_128  \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"  \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"  \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"  \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define DNNCTL_WG_OUT_256  \
  DNNCTL_WG_OUT_128,  \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),  \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// The asm statements, one per N (TYPES is ".f16.f16" or ".bf16.bf16"). scale-d is a
// predicate operand, set from the integer scale_d.
#define DNNCTL_WGMMA_N16(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32" TYPES " {" DNNCTL_WG_REGS_16  \
               "}, %8, %9, p, 1, 1, %11, %12;\n}\n"  \
               : DNNCTL_WG_OUT_16  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

#define DNNCTL_WGMMA_N32(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " {" DNNCTL_WG_REGS_32  \
               "}, %16, %17, p, 1, 1, %19, %20;\n}\n"  \
               : DNNCTL_WG_OUT_32  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

#define DNNCTL_WGMMA_N64(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {" DNNCTL_WG_REGS_64  \
               "}, %32, %33, p, 1, 1, %35, %36;\n}\n"  \
               : DNNCTL_WG_OUT_64  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

#define DNNCTL_WGMMA_N128(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " {" DNNCTL_WG_REGS_128  \
               "}, %64, %65, p, 1, 1, %67, %68;\n}\n"  \
               : DNNCTL_WG_OUT_128  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

#define DNNCTL_WGMMA_N256(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32" TYPES " {" DNNCTL_WG_REGS_256  \
               "}, %128, %129, p, 1, 1, %131, %132;\n}\n"  \
               : DNNCTL_WG_OUT_256  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))


template <int N, int TA, int TB, typename T>
__device__ __forceinline__ void wgmma_async(float (&d)[N / 2], unsigned long long da,
                                            unsigned long long db, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
                "wgmma wrappers exist for N = 16, 32, 64, 128, 256");
  if constexpr (WgIsBf16<T>::value) {
    if constexpr (N == 16) DNNCTL_WGMMA_N16(".bf16.bf16");
    if constexpr (N == 32) DNNCTL_WGMMA_N32(".bf16.bf16");
    if constexpr (N == 64) DNNCTL_WGMMA_N64(".bf16.bf16");
    if constexpr (N == 128) DNNCTL_WGMMA_N128(".bf16.bf16");
    if constexpr (N == 256) DNNCTL_WGMMA_N256(".bf16.bf16");
  } else {
    if constexpr (N == 16) DNNCTL_WGMMA_N16(".f16.f16");
    if constexpr (N == 32) DNNCTL_WGMMA_N32(".f16.f16");
    if constexpr (N == 64) DNNCTL_WGMMA_N64(".f16.f16");
    if constexpr (N == 128) DNNCTL_WGMMA_N128(".f16.f16");
    if constexpr (N == 256) DNNCTL_WGMMA_N256(".f16.f16");
  }
}


// Register-A form (PTX 9.7.15.5.1.1, "register fragment layout for matrix A"): the 64 x 16
// A operand comes from registers, thread t of the warpgroup holding rows 16 w + l / 4 (+ 8)
// and columns 2 (l % 4) (+ 1, + 8, + 9) as four .b32 pairs: a[0] (row, col), a[1] (row + 8,
// col), a[2] (row, col + 8), a[3] (row + 8, col + 8) -- the m16n8k16 A fragment, and exactly
// the accumulator pairs d[8 kk + 0..7] of an m64nN product over columns 16 kk .. 16 kk + 15
// (so P = softmax(S) feeds the next product without shared memory). B as above.
#define DNNCTL_WGMMA_RS_N64(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {" DNNCTL_WG_REGS_64  \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"  \
               : DNNCTL_WG_OUT_64  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB))

#define DNNCTL_WGMMA_RS_N128(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " {" DNNCTL_WG_REGS_128  \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"  \
               : DNNCTL_WG_OUT_128  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB))

#define DNNCTL_WGMMA_RS_N256(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"  \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32" TYPES " {" DNNCTL_WG_REGS_256  \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"  \
               : DNNCTL_WG_OUT_256  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB))


template <int N, int TB, typename T>
__device__ __forceinline__ void wgmma_async_rs(float (&d)[N / 2], const unsigned (&a)[4],
                                               unsigned long long db, int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "register-A wrappers exist for N = 64, 128, 256");
  if constexpr (WgIsBf16<T>::value) {
    if constexpr (N == 64) DNNCTL_WGMMA_RS_N64(".bf16.bf16");
    if constexpr (N == 128) DNNCTL_WGMMA_RS_N128(".bf16.bf16");
    if constexpr (N == 256) DNNCTL_WGMMA_RS_N256(".bf16.bf16");
  } else {
    if constexpr (N == 64) DNNCTL_WGMMA_RS_N64(".f16.f16");
    if constexpr (N == 128) DNNCTL_WGMMA_RS_N128(".f16.f16");
    if constexpr (N == 256) DNNCTL_WGMMA_RS_N256(".f16.f16");
  }
}

// Keeps the compiler from reusing an A-fragment register while a wgmma may still read it.
__device__ __forceinline__ void wg_fence_reg(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }

}  // namespace dnnctl
#endif  // DNNCTL_EMU
