// conv2d dgrad col2im, gather form: every dx element sums the column-matrix entries of the
// filter taps that read it (no atomics, deterministic), zero where no tap reaches.
//
// The column matrix has im2col.cu's layout, so one cuBLAS GEMM dy @ w fills it:
//   NHWC: col[g][m][r][s][c] (per group a row-major [N*P*Q, R*S*C/g] matrix)
//   NCHW: col[n][g][c][r][s][pq] (per image and group a row-major [C/g*R*S, P*Q] matrix)
// dx rows of input pixel (h, w) meet tap (r, s) at output (p, q) when
// h + pt - r*dh = p*sh (and the same for w): a tap contributes only on its stride phase.
// Covers images n0 .. n0 + nc - 1 (a chunk of the batch); grid-stride over dx elements.
// Defines: DNNCTL_DTYPE, NHWC (0/1).
#include <dnnctl/conv.cuh>
#include <dnnctl/conv_shape.cuh>

using namespace dnnctl;

#ifndef NHWC
#define NHWC 0
#endif

extern "C" __global__ void __launch_bounds__(256)
col2im(const elem_t* __restrict__ col, elem_t* __restrict__ dx, int n0, int nc, int C, int H,
       int W, int P, int Q, int R, int S, int sh, int sw, int pt, int pl, int dh, int dw,
       int groups) {
  const int Cg = C / groups;
  const int RS = R * S;
  const long long total = (long long)nc * C * H * W;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const TensorCoords o = tensor_coords<NHWC != 0>(e, C, H, W);  // o.n: image of the chunk
    const int g = o.c / Cg, cl = o.c - g * Cg;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) {
      const int p = tap_output(o.h, pt, r, dh, sh, P);
      if (p < 0) continue;
      for (int s = 0; s < S; ++s) {
        const int q = tap_output(o.w, pl, s, dw, sw, Q);
        if (q < 0) continue;
#if NHWC
        const long long m = ((long long)o.n * P + p) * Q + q;
        acc += to_float(col[(((long long)g * nc * P * Q + m) * RS + r * S + s) * Cg + cl]);
#else
        acc += to_float(col[((((long long)o.n * groups + g) * Cg + cl) * RS + r * S + s) *
                                (long long)(P * Q) + p * Q + q]);
#endif
      }
    }
    dx[tensor_index<NHWC != 0>(n0 + o.n, o.c, o.h, o.w, C, H, W)] = from_float<elem_t>(acc);
  }
}
