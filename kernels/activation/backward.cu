// Activation backward: dx = dy * act'(x [+ bias[c]]), and with a channel bias the fused bias
// gradient dbias[c] = sum of dx over every position of channel c.
// act_bwd_stream: a grid-stride vector stream (no bias).
// act_bwd_planes (NCHW: `outer` planes of `inner` elements per channel; grid (C, S)) and
// act_bwd_rows (NHWC: M rows of C; grid (S, channel tiles)) write dx and a partial dbias per
// (channel, split) to part[c * S + s]; act_bwd_finish folds the S partials in a fixed order.
// Defines: DNNCTL_DTYPE, ACT_FN_CODE (dnnctl::Act). Host: VEC divides the inner extent (NCHW)
// or C (NHWC) and the pointers are VEC-aligned (else VEC = 1).
#include <dnnctl/memory.cuh>

#ifndef ACT_FN_CODE
#define ACT_FN_CODE 1
#endif

using namespace dnnctl;

// d act / dz at z (fp32), NaN propagates.
__device__ __forceinline__ float act_grad(float z, float slope) {
  if (ACT_FN_CODE == ACT_RELU) return z > 0.f ? 1.f : (z != z ? z : 0.f);
  if (ACT_FN_CODE == ACT_LEAKY_RELU) return z > 0.f ? 1.f : (z != z ? z : slope);
  if (ACT_FN_CODE == ACT_GELU) {
    const float cdf = 0.5f * erfcf(-z * 0.70710678118654752f);
    return cdf + z * 0.3989422804014327f * __expf(-0.5f * z * z);
  }
  if (ACT_FN_CODE == ACT_GELU_TANH) {
    const float k = 0.7978845608028654f;
    const float u = k * (z + 0.044715f * z * z * z);
    const float t = tanhf(u);
    return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * z * z);
  }
  if (ACT_FN_CODE == ACT_SILU) {
    const float s = 1.f / (1.f + __expf(-z));
    return s * (1.f + z * (1.f - s));
  }
  if (ACT_FN_CODE == ACT_SIGMOID) {
    const float s = 1.f / (1.f + __expf(-z));
    return s * (1.f - s);
  }
  if (ACT_FN_CODE == ACT_TANH) {
    const float t = tanhf(z);
    return 1.f - t * t;
  }
  return 1.f;
}

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
act_bwd_stream(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
               elem_t* __restrict__ dx, I nvec, float slope) {
  for (I k = (I)blockIdx.x * BLOCK + threadIdx.x; k < nvec; k += (I)gridDim.x * BLOCK) {
    float g[VEC], v[VEC];
    load_vec<LD_NC, VEC>(dy + k * VEC, g);
    load_vec<LD_NC, VEC>(x + k * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) g[i] *= act_grad(v[i], slope);
    store_vec<ST_PLAIN, VEC>(dx + k * VEC, g);
  }
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
act_bwd_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
               const elem_t* __restrict__ bias, elem_t* __restrict__ dx,
               float* __restrict__ part, i64 outer, int C, int inner, float slope) {
  __shared__ float red[32];
  const int c = blockIdx.x;
  const float b = to_float(bias[c]);
  const int nv = inner / VEC;
  const i64 total = outer * nv;
  float s = 0.f;
  for (i64 k = (i64)blockIdx.y * BLOCK + threadIdx.x; k < total; k += (i64)gridDim.y * BLOCK) {
    const i64 o = k / nv;
    const i64 off = ((o * C + c) * nv + (k - o * nv)) * VEC;
    float g[VEC], v[VEC];
    load_vec<LD_NC, VEC>(dy + off, g);
    load_vec<LD_NC, VEC>(x + off, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      g[i] *= act_grad(v[i] + b, slope);
      s += g[i];
    }
    store_vec<ST_PLAIN, VEC>(dx + off, g);
  }
  s = block_sum<BLOCK / 32>(s, red);
  if (threadIdx.x == 0) part[(i64)c * gridDim.y + blockIdx.y] = s;
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
act_bwd_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
             const elem_t* __restrict__ bias, elem_t* __restrict__ dx,
             float* __restrict__ part, i64 M, int C, float slope) {
  DNNCTL_DYN_SMEM(float, sw);  // [BLOCK][VEC]
  const int cvn = C / VEC;
  const int tx_n = min(cvn, BLOCK);
  const int rb = BLOCK / tx_n;
  const int tx = threadIdx.x % tx_n, ty = threadIdx.x / tx_n;
  const int cv = blockIdx.y * tx_n + tx;
  const bool live = ty < rb && cv < cvn;
  float b[VEC], s[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    b[i] = live ? to_float(bias[cv * VEC + i]) : 0.f;
    s[i] = 0.f;
  }
  if (live) {
    for (i64 r = (i64)blockIdx.x * rb + ty; r < M; r += (i64)gridDim.x * rb) {
      float g[VEC], v[VEC];
      load_vec<LD_NC, VEC>(dy + r * C + cv * VEC, g);
      load_vec<LD_NC, VEC>(x + r * C + cv * VEC, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        g[i] *= act_grad(v[i] + b[i], slope);
        s[i] += g[i];
      }
      store_vec<ST_PLAIN, VEC>(dx + r * C + cv * VEC, g);
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) sw[threadIdx.x * VEC + i] = s[i];
  sync_block();
  if (ty != 0 || !live) return;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    float a = 0.f;
    for (int r = 0; r < rb; ++r) a += sw[(r * tx_n + tx) * VEC + i];
    part[(i64)(cv * VEC + i) * gridDim.x + blockIdx.x] = a;
  }
}

__global__ void __launch_bounds__(128)
act_bwd_finish(const float* __restrict__ part, int S, int C, elem_t* __restrict__ dbias) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= C) return;
  float a = 0.f;
  for (int s = 0; s < S; ++s) a += part[(i64)c * S + s];
  dbias[c] = from_float<elem_t>(a);
}
