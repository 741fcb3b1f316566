// Emulated dnnctl PTX primitives (kernels/include/dnnctl/ptx.cuh includes this file when
// built with -DDNNCTL_EMU). Semantics follow the PTX ISA; see emu_prelude.h.
#pragma once

#define DNNCTL_DECLARE_SMEM(name) unsigned char* name = emu::g_smem
#define DNNCTL_EMU_CHECK(cond, msg) \
  do {                               \
    if (!(cond)) emu::fail(msg);     \
  } while (0)

namespace dnnctl {

inline unsigned smem_u32(const void* p) {
  return (unsigned)(emu::check_smem(p, 1, "smem address") - emu::g_smem);
}

template <int BYTES>
inline void cp_async(void* dst, const void* src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  if ((uintptr_t)dst % BYTES) emu::fail("cp.async: shared destination not aligned");
  if ((uintptr_t)src % BYTES) emu::fail("cp.async: global source not aligned");
  emu::check_smem(dst, BYTES, "cp.async destination");
  if (pred) emu::check_global(src, BYTES, "cp.async source");
  emu::smem_write(dst, BYTES, "cp.async destination");
  emu::mark_pending(dst, BYTES);
  emu::cur->pending.push_back(
      {(unsigned char*)dst, (const unsigned char*)src, BYTES, pred ? BYTES : 0});
}

void emu_cp_async_commit();
void emu_cp_async_wait(int n);

inline void cp_async_commit() { emu_cp_async_commit(); }

template <int N>
inline void cp_async_wait() { emu_cp_async_wait(N); }

void emu_ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans);

inline void ldmatrix_x4(unsigned (&r)[4], const void* p) { emu_ldmatrix_x4(r, p, false); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) { emu_ldmatrix_x4(r, p, true); }

void emu_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], int kind);

template <typename T>
inline void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
template <>
inline void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  emu_mma(d, a, b, 0);
}
template <>
inline void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                     const unsigned (&b)[2]) {
  emu_mma(d, a, b, 1);
}
inline void mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  emu_mma(d, a, b, 2);
}

inline unsigned to_tf32(float x) {  // cvt.rna.tf32.f32: round to nearest, ties away
  unsigned u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
}

template <typename T>
inline T lds(const void* p) {
  if ((uintptr_t)p % sizeof(T)) emu::fail("shared load not aligned");
  emu::smem_read(p, sizeof(T), "shared load");
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
inline void sts(void* p, T v) {
  if ((uintptr_t)p % sizeof(T)) emu::fail("shared store not aligned");
  emu::smem_write(p, sizeof(T), "shared store");
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
inline T ldg(const T* p) {
  if ((uintptr_t)p % sizeof(T)) emu::fail("global load not aligned");
  emu::check_global(p, sizeof(T), "global load");
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
inline void stg(T* p, T v) {
  if ((uintptr_t)p % sizeof(T)) emu::fail("global store not aligned");
  emu::check_global(p, sizeof(T), "global store");
  std::memcpy(p, &v, sizeof(T));
}

inline void atomic_add(float* p, float v) {
  emu::check_global(p, 4, "atomicAdd");
  *p += v;
}

inline int atomic_inc(int* p) {
  emu::check_global(p, 4, "atomicAdd");
  return (*p)++;
}

inline void fence_device() {}

inline float ldcg(const float* p) { return ldg(p); }

inline void block_sync() { emu::block_barrier(); }

}  // namespace dnnctl
