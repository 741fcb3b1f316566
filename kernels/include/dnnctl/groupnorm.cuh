// Shared pieces of the group_norm kernels (kernels/norm/gn_*.cu).
// Defines: DNNCTL_DTYPE, LAYOUT (0 NCHW, 1 NHWC), AFFINE (0/1). Weight / bias fp32 (C,).
// A group (n, g) holds cpg = C / G channels x hw pixels:
//   NCHW: one contiguous run of cpg * hw elements; vector k covers elements k*VEC .. of channel
//         g*cpg + k*VEC / hw (host: hw % VEC == 0);
//   NHWC: hw runs of cpg elements, stride C; vector (p, cv) covers channels
//         g*cpg + cv*VEC .. (host: cpg % VEC == 0).
#pragma once
#include <dnnctl/memory.cuh>

#ifndef LAYOUT
#define LAYOUT 0
#endif
#ifndef AFFINE
#define AFFINE 1
#endif

namespace dnnctl {

struct GnGroup {
  i64 base;  // offset of the group's first element
  int cpg, hw, C, c0;
};

__device__ __forceinline__ GnGroup gn_group(int ng, int C, int hw, int G) {
  const int n = ng / G, g = ng % G, cpg = C / G;
#if LAYOUT == 0
  return GnGroup{((i64)n * C + (i64)g * cpg) * hw, cpg, hw, C, g * cpg};
#else
  return GnGroup{(i64)n * hw * C + (i64)g * cpg, cpg, hw, C, g * cpg};
#endif
}

// Vectors of a group: NCHW k in [0, cpg*hw/VEC); NHWC k = p * (cpg/VEC) + cv.
template <int VEC>
__device__ __forceinline__ int gn_vectors(const GnGroup& q) {
  return q.cpg * q.hw / VEC;
}

template <int VEC>
__device__ __forceinline__ i64 gn_offset(const GnGroup& q, int k, int& c) {
#if LAYOUT == 0
  c = q.c0 + k * VEC / q.hw;
  return q.base + (i64)k * VEC;
#else
  const int cpv = q.cpg / VEC;
  const int p = k / cpv, cv = k - p * cpv;
  c = q.c0 + cv * VEC;
  return q.base + (i64)p * q.C + cv * VEC;
#endif
}

// y = (x - mean) * rstd * w[c] + b[c] for one vector of channel(s) starting at c.
template <int VEC>
__device__ __forceinline__ void gn_apply(float (&f)[VEC], float mean, float rstd,
                                         const float* __restrict__ w,
                                         const float* __restrict__ b, int c) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
#if LAYOUT == 0
    const int ci = c;
#else
    const int ci = c + i;
#endif
    float t = (f[i] - mean) * rstd;
    if (AFFINE) t = t * w[ci] + b[ci];
    f[i] = t;
  }
}

}  // namespace dnnctl
