// Activation backward: dx = dy * act'(x [+ bias[c]]), and with a channel bias the fused bias
// gradient dbias[c] = sum of dx over every position of channel c.
// act_bwd_stream: a grid-stride vector stream (no bias).
// act_bwd_planes (NCHW: `outer` planes of `inner` elements per channel; grid (C, S)) and
// act_bwd_rows (NHWC: M rows of C; grid (S, channel tiles)) write dx and a partial dbias per
// (channel, split) to part[c * S + s]; act_bwd_finish folds the S partials in a fixed order.
// Defines: DNNCTL_DTYPE, ACT_FN_CODE (dnnctl::Act). Host: VEC divides the inner extent (NCHW)
// or C (NHWC) and the pointers are VEC-aligned (else VEC = 1).
#include <dnnctl/chanreduce.cuh>

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
  // torch's formulas at the kinks: relu6 passes only 0 < z < 6; hardswish z / 3 + 1/2
  // strictly inside (-3, 3), 0 at and below -3, 1 at and above 3; hardsigmoid 1/6 strictly
  // inside (-3, 3)
  if (ACT_FN_CODE == ACT_RELU6) return z != z ? z : (z > 0.f && z < 6.f ? 1.f : 0.f);
  if (ACT_FN_CODE == ACT_HARDSWISH) {
    if (z != z) return z;
    return z <= -3.f ? 0.f : (z < 3.f ? z * (1.f / 3.f) + 0.5f : 1.f);
  }
  if (ACT_FN_CODE == ACT_HARDSIGMOID) return z != z ? z : (z > -3.f && z < 3.f ? 1.f / 6.f : 0.f);
  return 1.f;
}

template <int BLOCK, int VEC, typename I>
__global__ void __launch_bounds__(BLOCK)
act_bwd_stream(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
               elem_t* __restrict__ dx, I nvec, float slope) {
  stream_pairs<BLOCK, VEC>(dy, x, nvec, [&](I k, float (&g)[VEC], const float (&v)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) g[i] *= act_grad(v[i], slope);
    store_vec<ST_PLAIN, VEC>(dx + k * VEC, g);
  });
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
act_bwd_planes(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
               const elem_t* __restrict__ bias, elem_t* __restrict__ dx,
               float* __restrict__ part, i64 outer, int C, int inner, float slope) {
  __shared__ float red[32];
  const int c = blockIdx.x;
  const float b = to_float(bias[c]);
  float s = 0.f;
  for_channel_vecs<BLOCK, VEC>(outer, C, c, inner / VEC, [&](i64 off) {
    float g[VEC], v[VEC];
    load_pair(dy, x, off, g, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      g[i] *= act_grad(v[i] + b, slope);
      s += g[i];
    }
    store_vec<ST_PLAIN, VEC>(dx + off, g);
  });
  s = block_sum<BLOCK / 32>(s, red);
  if (threadIdx.x == 0) part[(i64)c * gridDim.y + blockIdx.y] = s;
}

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
act_bwd_rows(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
             const elem_t* __restrict__ bias, elem_t* __restrict__ dx,
             float* __restrict__ part, i64 M, int C, float slope) {
  DNNCTL_DYN_SMEM(float, sw);  // [BLOCK][VEC]
  const ChannelTile t = channel_tile<BLOCK>(C / VEC, BLOCK);
  float b[VEC], s[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    b[i] = t.live ? to_float(bias[t.cv * VEC + i]) : 0.f;
    s[i] = 0.f;
  }
  for_tile_rows(t, M, [&](i64 r) {
    const i64 off = r * C + t.cv * VEC;
    float g[VEC], v[VEC];
    load_pair(dy, x, off, g, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      g[i] *= act_grad(v[i] + b[i], slope);
      s[i] += g[i];
    }
    store_vec<ST_PLAIN, VEC>(dx + off, g);
  });
  fold_row_lanes<BLOCK, VEC>(sw, t, s, 0.f, add_float, [&](const float (&total)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) part[(i64)(t.cv * VEC + i) * gridDim.x + blockIdx.x] = total[i];
  });
}

__global__ void __launch_bounds__(128)
act_bwd_finish(const float* __restrict__ part, int S, int C, elem_t* __restrict__ dbias) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  if (c >= C) return;
  float a = 0.f;
  for (int s = 0; s < S; ++s) a += part[(i64)c * S + s];
  dbias[c] = from_float<elem_t>(a);
}
