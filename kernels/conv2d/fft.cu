// conv2d "fft" helpers around cuFFT: real-valued fp32 staging buffers in and out of the
// transforms. The convolution itself is  y = crop( irfft2( rfft2(x_pad) * conj(rfft2(w_dil)) ) )
// (cross-correlation), summed over input channels by a complex GEMM per frequency.
//
// fft_filter: wr[k][c][u][v] (Hf x Wf per filter) = w[k][c][u/dh][v/dw] on the dilation grid,
//             0 elsewhere.
// fft_pad:    xr[nl][c][u][v] = x[n0 + nl][c][u - pt][v - pl] inside the image, 0 elsewhere.
// fft_crop:   y[n0 + nl][k][p][q] = epilogue(scale * yr[nl][k][p*sh][q*sw]), threads follow
//             y's layout so the stores are coalesced.
// Defines: DNNCTL_DTYPE, NHWC (0/1: layout of x, w and y).
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
fft_filter(const elem_t* __restrict__ w, float* __restrict__ wr, int K, int Cg, int R, int S,
           int dh, int dw, int Hf, int Wf) {
  const long long total = (long long)K * Cg * Hf * Wf;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    int v, u, c, k;
    unravel4(e, Wf, Hf, Cg, v, u, c, k);
    const int r = u / dh, s = v / dw;
    float val = 0.f;
    if (u == r * dh && v == s * dw && r < R && s < S)
      val = to_float(w[tensor_index<kChannelsLast>(k, c, r, s, Cg, R, S)]);
    wr[e] = val;
  }
}

extern "C" __global__ void __launch_bounds__(256)
fft_pad(const elem_t* __restrict__ x, float* __restrict__ xr, int n0, int nc, int C, int H,
        int W, int pt, int pl, int Hf, int Wf) {
  const long long total = (long long)nc * C * Hf * Wf;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    int v, u, c, nl;
    unravel4(e, Wf, Hf, C, v, u, c, nl);
    const int ih = u - pt, iw = v - pl;
    float val = 0.f;
    if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
      val = to_float(x[tensor_index<kChannelsLast>(n0 + nl, c, ih, iw, C, H, W)]);
    xr[e] = val;
  }
}

extern "C" __global__ void __launch_bounds__(256)
fft_crop(const float* __restrict__ yr, elem_t* __restrict__ y, const elem_t* __restrict__ bias,
         const elem_t* __restrict__ residual, int n0, int nc, int K, int P, int Q, int sh,
         int sw, int Hf, int Wf, float scale, int act, int flags) {
  const long long total = (long long)nc * K * P * Q;
  const long long y_off = (long long)n0 * K * P * Q;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const TensorCoords o = tensor_coords<kChannelsLast>(e, K, P, Q);  // o.n: image of the chunk
    const float v = scale * yr[(((long long)o.n * K + o.c) * Hf + (long long)o.h * sh) * Wf +
                               (long long)o.w * sw];
    const long long yi = y_off + e;
    y[yi] = from_float<elem_t>(conv::epilogue(v, o.c, yi, bias, residual, act, flags));
  }
}
