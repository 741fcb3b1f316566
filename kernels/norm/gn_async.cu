// group_norm, a block per (n, GPB consecutive groups) staged in shared memory by cp.async:
// every copy of the block is in flight at once (one DRAM read of x, no register staging),
// then exact two-pass statistics per group from shared memory, then the normalized values
// go out (one DRAM write). Several groups per block make the NHWC pixel runs
// GPB * CPG channels long (whole 32-byte sectors instead of 16-byte pieces).
//   NCHW: the GPB groups are one contiguous run of GPB * CPG * HW elements;
//         vector k = elements k*VEC .. (host: HW % VEC == 0).
//   NHWC: per pixel a run of GPB * CPG channels (stride CH); vector k = pixel k / RV,
//         channels (k % RV) * VEC .. of the run (host: CPG % VEC == 0).
// Grid: N * GROUPS / GPB blocks; dynamic smem GPB * CPG * HW elements.
// Defines: DNNCTL_DTYPE, LAYOUT, AFFINE, CH, HW, CPG, GROUPS (geometry compiled in).
#include <dnnctl/groupnorm.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int GPB>
__global__ void __launch_bounds__(BLOCK)
gn_async(const elem_t* __restrict__ x, elem_t* __restrict__ y, const float* __restrict__ w,
         const float* __restrict__ b, float eps) {
  constexpr int GV = CPG * HW / VEC;  // vectors per group
  constexpr int NV = GPB * GV;        // vectors per block
  constexpr int VG = CPG / VEC;       // NHWC: vectors of one group per pixel
  constexpr int RV = GPB * VG;        // NHWC: vectors per pixel run
  constexpr float INV_COUNT = 1.f / (float)(CPG * HW);
  DNNCTL_DYN_SMEM(elem_t, buf);
  __shared__ float red[32];
  __shared__ float stat[2 * GPB];  // per group: mean, rstd

  const i64 n = blockIdx.x / (GROUPS / GPB);
  const int c0 = (int)(blockIdx.x % (GROUPS / GPB)) * GPB * CPG;
#if LAYOUT == 0
  const i64 base = (n * CH + c0) * (i64)HW;
#else
  const i64 base = n * (i64)HW * CH + c0;
#endif

  // 1. stage: vector k of the block -> buf[k * VEC]
  for (int k = threadIdx.x; k < NV; k += BLOCK) {
#if LAYOUT == 0
    const i64 off = base + (i64)k * VEC;
#else
    const i64 off = base + (i64)(k / RV) * CH + (k % RV) * VEC;
#endif
    stage_vec<VEC>(buf + k * VEC, x + off);
  }
  stage_wait();
  sync_block();

  // 2. per group: mean, then the centered sum of squares (exact two-pass, from smem)
#pragma unroll 1
  for (int g = 0; g < GPB; ++g) {
    auto group_pass = [&](auto&& fn) {  // fn(f) on this thread's vectors of group g
      for (int t = threadIdx.x; t < GV; t += BLOCK) {
#if LAYOUT == 0
        const int k = g * GV + t;
#else
        const int k = (t / VG) * RV + g * VG + t % VG;
#endif
        float f[VEC];
        load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
        fn(f);
      }
    };
    float s = 0.f;
    group_pass([&](const float (&f)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += f[i];
    });
    const float mean = block_sum<BLOCK / 32>(s, red) * INV_COUNT;
    float q = 0.f;
    group_pass([&](const float (&f)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) q += (f[i] - mean) * (f[i] - mean);
    });
    q = block_sum<BLOCK / 32>(q, red);
    if (threadIdx.x == 0) {
      stat[2 * g] = mean;
      stat[2 * g + 1] = rsqrtf(q * INV_COUNT + eps);
    }
  }
  sync_block();

  // 3. normalize from smem, write out
  for (int k = threadIdx.x; k < NV; k += BLOCK) {
#if LAYOUT == 0
    const int gi = k / GV;
    const int c = c0 + k * VEC / HW;
    const i64 off = base + (i64)k * VEC;
#else
    const int cv = k % RV;
    const int gi = cv / VG;
    const int c = c0 + cv * VEC;
    const i64 off = base + (i64)(k / RV) * CH + cv * VEC;
#endif
    float f[VEC];
    load_vec<LD_PLAIN, VEC>(buf + k * VEC, f);
    gn_apply<VEC>(f, stat[2 * gi], stat[2 * gi + 1], w, b, c);
    store_vec<ST_PLAIN, VEC>(y + off, f);
  }
}
