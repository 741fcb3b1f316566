// conv2d im2col: the explicit patch matrix that turns a convolution into one cuBLAS GEMM.
//
// im2col_nhwc writes col[g][m][r][s][c] (per group a row-major [N*P*Q, R*S*C/g] matrix whose
//   rows match the (K, R, S, C/g) weights), VEC channels per access; grid.y = filter tap.
// im2col_nchw writes col[n][g][c][r][s][pq] (per image and group a row-major [C/g*R*S, P*Q]
//   matrix whose rows match the (K, C/g, R, S) weights); grid.y = (c, r, s) row,
//   grid.z = (image, group).
// Zero outside the padded image. Both cover images n0 .. n0 + nc - 1 (a chunk of the batch).
// Defines: DNNCTL_DTYPE, NHWC (0/1), VEC (NHWC: channels per access; C/g % VEC == 0).
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

#ifndef VEC
#define VEC 1
#endif

#if NHWC
extern "C" __global__ void __launch_bounds__(256)
im2col_nhwc(const elem_t* __restrict__ x, elem_t* __restrict__ col, int n0, int nc, int C,
            int H, int W, int P, int Q, int R, int S, int sh, int sw, int pt, int pl, int dh,
            int dw, int groups) {
  typedef conv::Vec<VEC> vec_t;
  const int Cg = C / groups;
  const int CV = Cg / VEC;
  const int PQ = P * Q;
  const int NPQ = nc * PQ;
  const int RS = R * S;
  const int rs = blockIdx.y;
  const int r = rs / S;
  const int s = rs - r * S;
  const long long total = (long long)groups * NPQ * CV;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const int cv = (int)(e % CV);
    const long long t = e / CV;
    const int m = (int)(t % NPQ);
    const int g = (int)(t / NPQ);
    const int nl = m / PQ;
    const int pq = m - nl * PQ;
    const int p = pq / Q;
    const int q = pq - p * Q;
    const int ih = p * sh - pt + r * dh;
    const int iw = q * sw - pl + s * dw;
    vec_t v;
    if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) {
      v = *reinterpret_cast<const vec_t*>(
          x + (((long long)(n0 + nl) * H + ih) * W + iw) * C + g * Cg + cv * VEC);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v.v[i] = from_float<elem_t>(0.f);
    }
    *reinterpret_cast<vec_t*>(col + (((long long)g * NPQ + m) * RS + rs) * Cg + cv * VEC) = v;
  }
}
#else
extern "C" __global__ void __launch_bounds__(256)
im2col_nchw(const elem_t* __restrict__ x, elem_t* __restrict__ col, int n0, int nc, int C,
            int H, int W, int P, int Q, int R, int S, int sh, int sw, int pt, int pl, int dh,
            int dw, int groups) {
  const int Cg = C / groups;
  const int RS = R * S;
  const int PQ = P * Q;
  const int crs = blockIdx.y;
  const int c = crs / RS;
  const int rs = crs - c * RS;
  const int r = rs / S;
  const int s = rs - r * S;
  const int ng = blockIdx.z;  // nl * groups + g
  const int g = ng % groups;
  const int nl = ng / groups;
  const elem_t* plane = x + ((long long)(n0 + nl) * C + g * Cg + c) * H * W;
  elem_t* dst = col + ((long long)ng * Cg * RS + crs) * PQ;
  for (int pq = blockIdx.x * blockDim.x + threadIdx.x; pq < PQ; pq += gridDim.x * blockDim.x) {
    const int p = pq / Q;
    const int q = pq - p * Q;
    const int ih = p * sh - pt + r * dh;
    const int iw = q * sw - pl + s * dw;
    dst[pq] = ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
                  ? plane[(long long)ih * W + iw]
                  : from_float<elem_t>(0.f);
  }
}
#endif
