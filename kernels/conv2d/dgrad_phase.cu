// conv2d dgrad as forward convolutions of dy, one per stride phase (no zero insertion).
//
// Input rows h = a + i*sh (phase a) receive only the filter rows r = r0 + j*T (T = sh /
// gcd(sh, dh)), at dy row p = i + off - j*D; the phase is then a stride-1 forward
// convolution of dy with the flipped sub-filter (dilation D) written to a phase buffer, or
// straight into dx when the stride is 1. These kernels prepare and finish those calls.
//
// phase_weights: w (K, C/g, R, S) or (K, R, S, C/g) -> the phase's forward weights, with
//   the roles of K and C swapped per group: w'[g*Cg + c][kk][j'][l'] (NCHW) or
//   w'[g*Cg + c][j'][l'][kk] (NHWC) = w[g*Kg + kk][c][r0 + (Ra-1-j')*T][s0 + (Sb-1-l')*U].
// phase_scatter: dx[n][c][a + i*sh][b + j*sw] = buf[n][c][i][j] (buf is Pb x Qb, at least
//   the phase's Ha x Wb), or 0 when the phase has no taps (buf unused).
// Defines: DNNCTL_DTYPE, NHWC (0/1). Grid-stride loops.
#include <dnnctl/conv.cuh>

using namespace dnnctl;

#ifndef NHWC
#define NHWC 0
#endif

extern "C" __global__ void __launch_bounds__(256)
phase_weights(const elem_t* __restrict__ w, elem_t* __restrict__ wp, int K, int C, int R,
              int S, int groups, int r0, int T, int Ra, int s0, int U, int Sb) {
  const int Cg = C / groups, Kg = K / groups;
  const long long total = (long long)C * Kg * Ra * Sb;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
#if NHWC
    const int kk = (int)(e % Kg);
    long long t = e / Kg;
    const int l = (int)(t % Sb);
    t /= Sb;
    const int j = (int)(t % Ra);
    const int c = (int)(t / Ra);  // output channel of the phase conv = input channel of w
#else
    const int l = (int)(e % Sb);
    long long t = e / Sb;
    const int j = (int)(t % Ra);
    t /= Ra;
    const int kk = (int)(t % Kg);
    const int c = (int)(t / Kg);
#endif
    const int g = c / Cg, cl = c - g * Cg;
    const int k = g * Kg + kk;
    const int r = r0 + (Ra - 1 - j) * T, s = s0 + (Sb - 1 - l) * U;
#if NHWC
    wp[e] = w[(((long long)k * R + r) * S + s) * Cg + cl];
#else
    wp[e] = w[(((long long)k * Cg + cl) * R + r) * S + s];
#endif
  }
}

extern "C" __global__ void __launch_bounds__(256)
phase_scatter(const elem_t* __restrict__ buf, elem_t* __restrict__ dx, int N, int C, int H,
              int W, int sh, int sw, int a, int b, int Ha, int Wb, int Pb, int Qb, int taps) {
  const long long total = (long long)N * C * Ha * Wb;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
#if NHWC
    const int c = (int)(e % C);
    long long t = e / C;
    const int j = (int)(t % Wb);
    t /= Wb;
    const int i = (int)(t % Ha);
    const int n = (int)(t / Ha);
    const long long src = (((long long)n * Pb + i) * Qb + j) * C + c;
    const long long dst = (((long long)n * H + a + i * sh) * W + b + j * sw) * C + c;
#else
    const int j = (int)(e % Wb);
    long long t = e / Wb;
    const int i = (int)(t % Ha);
    t /= Ha;
    const int c = (int)(t % C);
    const int n = (int)(t / C);
    const long long src = (((long long)n * C + c) * Pb + i) * Qb + j;
    const long long dst = (((long long)n * C + c) * H + a + i * sh) * W + b + j * sw;
#endif
    dx[dst] = taps ? buf[src] : from_float<elem_t>(0.f);
  }
}
