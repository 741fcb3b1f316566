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
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
col2im(const elem_t* __restrict__ col, elem_t* __restrict__ dx, int n0, int nc, int C, int H,
       int W, int P, int Q, int R, int S, int sh, int sw, int pt, int pl, int dh, int dw,
       int groups) {
  // the chunk's geometry (output channels do not enter: the GEMM has summed over them)
  const ConvShape g = {nc, C, H, W, 0, R, S, P, Q, sh, sw, pt, pl, dh, dw, C / groups, 0};
  const int Cg = g.cg;
  const int RS = R * S;
  const long long total = (long long)nc * C * H * W;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const TensorCoords o = tensor_coords<kChannelsLast>(e, C, H, W);  // o.n: image of the chunk
    const int grp = o.c / Cg, cl = o.c - grp * Cg;
    float acc = 0.f;
    for_each_tap(g, o.h, o.w, [&](int r, int s, int p, int q) {
#if NHWC
      const long long m = ((long long)o.n * P + p) * Q + q;
      acc += to_float(col[(((long long)grp * nc * P * Q + m) * RS + r * S + s) * Cg + cl]);
#else
      acc += to_float(col[((((long long)o.n * groups + grp) * Cg + cl) * RS + r * S + s) *
                              (long long)(P * Q) + p * Q + q]);
#endif
    });
    dx[tensor_index<kChannelsLast>(n0 + o.n, o.c, o.h, o.w, C, H, W)] = from_float<elem_t>(acc);
  }
}
