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
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
phase_weights(const elem_t* __restrict__ w, elem_t* __restrict__ wp, int K, int C, int R,
              int S, int groups, int r0, int T, int Ra, int s0, int U, int Sb) {
  const int Cg = C / groups, Kg = K / groups;
  const long long total = (long long)C * Kg * Ra * Sb;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    // wp is (C, Kg, Ra, Sb) in the layout: its "image" is the phase conv's output channel c,
    // an input channel of w
    const TensorCoords o = tensor_coords<kChannelsLast>(e, Kg, Ra, Sb);
    const int c = o.n, kk = o.c, j = o.h, l = o.w;
    const int g = c / Cg, cl = c - g * Cg;
    const int k = g * Kg + kk;
    const int r = r0 + (Ra - 1 - j) * T, s = s0 + (Sb - 1 - l) * U;
    wp[e] = w[tensor_index<kChannelsLast>(k, cl, r, s, Cg, R, S)];
  }
}

extern "C" __global__ void __launch_bounds__(256)
phase_scatter(const elem_t* __restrict__ buf, elem_t* __restrict__ dx, int N, int C, int H,
              int W, int sh, int sw, int a, int b, int Ha, int Wb, int Pb, int Qb, int taps) {
  const long long total = (long long)N * C * Ha * Wb;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const TensorCoords o = tensor_coords<kChannelsLast>(e, C, Ha, Wb);
    const long long src = tensor_index<kChannelsLast>(o.n, o.c, o.h, o.w, C, Pb, Qb);
    const long long dst =
        tensor_index<kChannelsLast>(o.n, o.c, a + o.h * sh, b + o.w * sw, C, H, W);
    dx[dst] = taps ? buf[src] : from_float<elem_t>(0.f);
  }
}
