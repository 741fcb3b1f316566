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
#if NHWC
    const int c = (int)(e % C);
    long long t = e / C;
    const int w = (int)(t % W);
    t /= W;
    const int h = (int)(t % H);
    const int nl = (int)(t / H);
#else
    const int w = (int)(e % W);
    long long t = e / W;
    const int h = (int)(t % H);
    t /= H;
    const int c = (int)(t % C);
    const int nl = (int)(t / C);
#endif
    const int g = c / Cg, cl = c - g * Cg;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) {
      const int hh = h + pt - r * dh;
      if (hh < 0 || hh % sh) continue;
      const int p = hh / sh;
      if (p >= P) continue;
      for (int s = 0; s < S; ++s) {
        const int ww = w + pl - s * dw;
        if (ww < 0 || ww % sw) continue;
        const int q = ww / sw;
        if (q >= Q) continue;
#if NHWC
        const long long m = ((long long)nl * P + p) * Q + q;
        acc += to_float(col[(((long long)g * nc * P * Q + m) * RS + r * S + s) * Cg + cl]);
#else
        acc += to_float(col[((((long long)nl * groups + g) * Cg + cl) * RS + r * S + s) *
                                (long long)(P * Q) + p * Q + q]);
#endif
      }
    }
#if NHWC
    dx[(((long long)(n0 + nl) * H + h) * W + w) * C + c] = from_float<elem_t>(acc);
#else
    dx[(((long long)(n0 + nl) * C + c) * H + h) * W + w] = from_float<elem_t>(acc);
#endif
  }
}
