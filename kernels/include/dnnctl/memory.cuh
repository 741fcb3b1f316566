// dnnctl helpers for memory-bound kernels: vector loads/stores of elem_t as fp32 (several in
// flight per thread, pairs of inputs), warp and block reductions, Welford (and its partials in
// global memory) and online-softmax combines. NVRTC-compatible (no host headers).
// Kernels include it as <dnnctl/memory.cuh>; it includes <dnnctl/common.cuh>.
#pragma once
#include <dnnctl/common.cuh>
#include <dnnctl/mufu.cuh>

// Under -DDNNCTL_EMU (tests/unit/test_ops_memory_emu.py runs these kernels on the CPU
// emulator of tools/cuda_emu) the test harness shims CUDA's intrinsics (__syncthreads,
// __shfl_xor_sync, __ldg, __ldcs, __stcs, ...), so the emulator runs this very code. Only
// two things differ: the dynamic shared-memory declaration, and plain dereferences in the
// vector helpers, which go through hooks that check bounds, alignment and smem races.
#ifdef DNNCTL_EMU
#define DNNCTL_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(emu::g_smem)
#define DNNCTL_DEREF_LD(p) emu_deref_load(p)
#define DNNCTL_DEREF_ST(p, v) emu_deref_store(p, v)
#else
// dynamic shared memory: `DNNCTL_DYN_SMEM(float, buf);` declares `float* buf`
#define DNNCTL_DYN_SMEM(T, name)                         \
  extern __shared__ __align__(16) unsigned char name##_raw[]; \
  T* name = reinterpret_cast<T*>(name##_raw)
#define DNNCTL_DEREF_LD(p) (*(p))
#define DNNCTL_DEREF_ST(p, v) (*(p) = (v))
#endif

#define DNNCTL_INF __int_as_float(0x7f800000)

namespace dnnctl {

typedef long long i64;

__device__ __forceinline__ void sync_block() { __syncthreads(); }

// Butterfly exchange with lane ^ o; every lane of the warp must call it (full mask).
__device__ __forceinline__ float shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}

// ---------------------------------------------------------------------------- vector I/O
// A "vector" is N consecutive elements read or written with as few instructions as possible:
// 16-byte chunks (ld.global.v4.u32) when N * sizeof(T) >= 16, else one 8/4/2-byte access.
// The address must be aligned to min(16, N * sizeof(T)) bytes: the host checks pointers and
// falls back to N = 1 when they are not.

template <int BYTES> struct Bits;
template <> struct Bits<2> { typedef unsigned short type; };
template <> struct Bits<4> { typedef unsigned int type; };
template <> struct Bits<8> { typedef uint2 type; };
template <> struct Bits<16> { typedef uint4 type; };

enum LoadPolicy { LD_PLAIN = 0, LD_NC = 1, LD_STREAM = 2 };
enum StorePolicy { ST_PLAIN = 0, ST_STREAM = 1 };

template <int L, typename B>
__device__ __forceinline__ B ld_bits(const B* p) {
  if (L == LD_NC) return __ldg(p);        // read-only path; never for data this kernel writes
  if (L == LD_STREAM) return __ldcs(p);   // evict-first: read once
  return DNNCTL_DEREF_LD(p);
}

template <int S, typename B>
__device__ __forceinline__ void st_bits(B* p, B v) {
  if (S == ST_STREAM) __stcs(p, v);
  else DNNCTL_DEREF_ST(p, v);
}

template <typename T, int N>
struct VecShape {
  static constexpr int BYTES = N * (int)sizeof(T);
  static constexpr int CHUNK = BYTES > 16 ? 16 : BYTES;   // bytes per access
  static constexpr int PER = CHUNK / (int)sizeof(T);       // elements per access
  static constexpr int COUNT = N / PER;                    // accesses
  static_assert(PER * COUNT == N, "vector length must fill whole accesses");
};

template <int L, int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[N]) {
  typedef VecShape<T, N> S;
  typedef typename Bits<S::CHUNK>::type B;
#pragma unroll
  for (int c = 0; c < S::COUNT; ++c) {
    B b = ld_bits<L>(reinterpret_cast<const B*>(p + c * S::PER));
    const T* e = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int i = 0; i < S::PER; ++i) f[c * S::PER + i] = to_float(e[i]);
  }
}

template <int S_, int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[N]) {
  typedef VecShape<T, N> S;
  typedef typename Bits<S::CHUNK>::type B;
#pragma unroll
  for (int c = 0; c < S::COUNT; ++c) {
    B b;
    T* e = reinterpret_cast<T*>(&b);
#pragma unroll
    for (int i = 0; i < S::PER; ++i) e[i] = from_float<T>(f[c * S::PER + i]);
    st_bits<S_>(reinterpret_cast<B*>(p + c * S::PER), b);
  }
}

// fp32 parameter vectors (batch/group norm weights): N floats, 16-byte chunks.
template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&f)[N]) {
  load_vec<LD_NC, N, float>(p, f);
}

// U independent vector loads in flight per thread (a loop that adds each vector as it comes
// has one): the vectors k = k0 + u * step (u < U, k < end) at src + k * pitch are all loaded
// before use(k, v) runs on each, in order of u (k * pitch in the wider of I and P).
template <int U, int VEC, int L, typename I, typename P, typename T, typename F>
__device__ __forceinline__ void load_unrolled(const T* src, P pitch, I k0, I step, I end,
                                              F&& use) {
  float v[U][VEC];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const I k = k0 + (I)u * step;
    if (k < end) load_vec<L, VEC>(src + k * pitch, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const I k = k0 + (I)u * step;
    if (k < end) use(k, v[u]);
  }
}

// The vectors at element offset `off` of two inputs of one shape (an elementwise backward:
// dy and x), in fp32.
template <int VEC, typename I>
__device__ __forceinline__ void load_pair(const elem_t* pa, const elem_t* pb, I off,
                                          float (&a)[VEC], float (&b)[VEC]) {
  load_vec<LD_NC, VEC>(pa + off, a);
  load_vec<LD_NC, VEC>(pb + off, b);
}

// A grid-stride stream over the nvec vectors of two inputs of one shape: fn(k, a, b) with
// vector k of pa and of pb (load_pair).
template <int BLOCK, int VEC, typename I, typename F>
__device__ __forceinline__ void stream_pairs(const elem_t* pa, const elem_t* pb, I nvec, F&& fn) {
  for (I k = (I)blockIdx.x * BLOCK + threadIdx.x; k < nvec; k += (I)gridDim.x * BLOCK) {
    float a[VEC], b[VEC];
    load_pair(pa, pb, k * VEC, a, b);
    fn(k, a, b);
  }
}

// ---------------------------------------------------------------------------- reductions
// Groups of WIDTH consecutive lanes (WIDTH a power of two <= 32). Every lane of the warp must
// execute these (full mask): kernels keep out-of-range threads alive and let them add identity.

template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
  return v;
}

template <int WIDTH>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
  return v;
}

// Block-wide reduction over NWARPS full warps: each warp reduces its values (warp_reduce),
// lane 0 publishes the warp's result in shared `slots`, then every warp reduces the NWARPS
// slots (`identity` on the lanes past them), so every thread gets the result. The leading
// barrier makes back-to-back calls on the same slots safe.
template <int NWARPS, typename T, typename WarpReduce>
__device__ __forceinline__ T block_reduce(T v, T* slots, T identity, WarpReduce&& warp_reduce) {
  v = warp_reduce(v);
  if (NWARPS == 1) return v;
  sync_block();
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  sync_block();
  const int lane = threadIdx.x & 31;
  T w = identity;  // (lanes past NWARPS; a select of two structs would go through local memory)
  if (lane < NWARPS) w = slots[lane];
  return warp_reduce(w);
}

// Block-wide sum / max; ``red`` is a shared array of >= 32 floats.
template <int NWARPS>
__device__ __forceinline__ float block_sum(float v, float* red) {
  return block_reduce<NWARPS>(v, red, 0.f, [](float a) { return group_sum<32>(a); });
}

template <int NWARPS>
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce<NWARPS>(v, red, -DNNCTL_INF, [](float a) { return group_max<32>(a); });
}

// ---------------------------------------------------------------------------- Welford
// Running (count, mean, M2); combine is Chan et al.'s parallel formula. Counts are floats
// (exact to 2^24 per partial; partials are combined in float with relative error ~1e-7).

struct Welford {
  float n, mean, m2;
};

__device__ __forceinline__ Welford welford_init() { return Welford{0.f, 0.f, 0.f}; }

__device__ __forceinline__ void welford_add(Welford& w, float x) {
  w.n += 1.f;
  const float d = x - w.mean;
  w.mean += d / w.n;
  w.m2 += d * (x - w.mean);
}

__device__ __forceinline__ Welford welford_combine(const Welford& a, const Welford& b) {
  if (b.n == 0.f) return a;
  if (a.n == 0.f) return b;
  const float n = a.n + b.n;
  const float d = b.mean - a.mean;
  const float fb = b.n / n;
  return Welford{n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

// A partial in global memory: three floats (n, mean, M2) at p.
__device__ __forceinline__ void welford_store(float* p, const Welford& w) {
  p[0] = w.n;
  p[1] = w.mean;
  p[2] = w.m2;
}

// The `count` partials at p, p + 3, ... folded in order (deterministic: every reader of the
// same partials gets the same bits).
__device__ __forceinline__ Welford welford_fold(const float* p, int count) {
  Welford t = welford_init();
  for (int i = 0; i < count; ++i)
    t = welford_combine(t, Welford{p[3 * i], p[3 * i + 1], p[3 * i + 2]});
  return t;
}

template <int WIDTH>
__device__ __forceinline__ Welford group_welford(Welford w) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) {
    Welford t;
    t.n = shfl_xor(w.n, o);
    t.mean = shfl_xor(w.mean, o);
    t.m2 = shfl_xor(w.m2, o);
    w = welford_combine(w, t);
  }
  return w;
}

// Block-wide Welford; ``red`` holds >= 96 floats (32 Welfords).
template <int NWARPS>
__device__ __forceinline__ Welford block_welford(Welford w, float* red) {
  return block_reduce<NWARPS>(w, reinterpret_cast<Welford*>(red), welford_init(),
                              [](const Welford& a) { return group_welford<32>(a); });
}

// Per-vector Welford step: the vector's own mean and M2, then one Chan combine.
template <int VEC>
__device__ __forceinline__ void welford_add_vec(Welford& w, const float (&f)[VEC]) {
  if (VEC == 1) {
    welford_add(w, f[0]);
    return;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) s += f[i];
  const float vm = s * (1.f / VEC);
  float m2 = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) m2 += (f[i] - vm) * (f[i] - vm);
  w = welford_combine(w, Welford{(float)VEC, vm, m2});
}

// ---------------------------------------------------------------------------- softmax
// Online (max, sum of exp(x - max)) with the special cases that keep NaN/inf semantics equal
// to the two-pass formula: a -inf element adds nothing, an empty partial (s == 0) rescales to
// nothing, and NaN (in x or from inf - inf) reaches the sum and propagates.

// exp for the element type's precision: accurate expf for fp32 I/O, one MUFU op for 16-bit.
__device__ __forceinline__ float fast_exp(float x) {
#if DNNCTL_DTYPE == 0
  return expf(x);
#else
  return ex2_approx(x * 1.4426950408889634f);
#endif
}

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum maxsum_init() { return MaxSum{-DNNCTL_INF, 0.f}; }

__device__ __forceinline__ void maxsum_add(MaxSum& a, float x) {
  const float m = fmaxf(a.m, x);
  a.s = (a.s == 0.f ? 0.f : a.s * fast_exp(a.m - m)) + (x == -DNNCTL_INF ? 0.f : fast_exp(x - m));
  a.m = m;
}

__device__ __forceinline__ MaxSum maxsum_combine(const MaxSum& a, const MaxSum& b) {
  const float m = fmaxf(a.m, b.m);
  const float s = (a.s == 0.f ? 0.f : a.s * fast_exp(a.m - m)) +
                  (b.s == 0.f ? 0.f : b.s * fast_exp(b.m - m));
  return MaxSum{m, s};
}

// Rescale a partial to a known row maximum ``m`` (for block-wide combination by sum).
__device__ __forceinline__ float maxsum_rescale(const MaxSum& a, float m) {
  return a.s == 0.f ? 0.f : a.s * fast_exp(a.m - m);
}

}  // namespace dnnctl
