// conv2d "direct": output-stationary tiles on CUDA cores, any layout / dtype / groups /
// stride / dilation / padding, fp32 accumulation, fused epilogue.
//
// Per group g the convolution is a product over the reduction index kred of (c, r, s):
//   y[pixel m, channel kn] = sum_kred x_patch[m][kred] * w[g*Kg + kn][kred]
// with kred ordered as the weights are stored: (c, r, s) for NCHW, (r, s, c) for NHWC, so a
// filter's reduction row is contiguous. A block owns BM output pixels x BN output channels of
// one group; each BK-slice of the reduction is staged in shared memory (input patches gathered
// on the fly, zero outside the padded image), double-buffered through registers, and every
// thread accumulates a TM x TN register tile.
//
// Defines: DNNCTL_DTYPE (0 fp32, 1 fp16, 2 bf16), NHWC (0/1), BM, BN, TM, TN, BK.
// Grid: (ceil(N*P*Q / BM), ceil(Kg / BN), groups); block: (BM/TM)*(BN/TN) threads.
#include <dnnctl/conv.cuh>

using namespace dnnctl;

#ifndef NHWC
#define NHWC 0
#endif
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 32
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 2
#endif
#ifndef BK
#define BK 8
#endif

#define THREADS ((BM / TM) * (BN / TN))
#define A_LOADS (BK * BM / THREADS)
#define B_LOADS (BK * BN / THREADS)
#define PAD 4

static_assert(BM % TM == 0 && BN % TN == 0, "tile must divide by the thread tile");
static_assert((BK * BM) % THREADS == 0 && (BK * BN) % THREADS == 0, "loads must divide");
static_assert(THREADS % BK == 0, "threads must be a multiple of BK");

extern "C" __global__ void __launch_bounds__(THREADS)
conv_direct(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y,
            const elem_t* __restrict__ bias, const elem_t* __restrict__ residual, int N, int C,
            int H, int W, int K, int P, int Q, int R, int S, int sh, int sw, int pt, int pl,
            int dh, int dw, int groups, int act, int flags) {
  __shared__ float As[2][BK][BM + PAD];
  __shared__ float Bs[2][BK][BN + PAD];

  const int Cg = C / groups, Kg = K / groups;
  const int RS = R * S;
  const int KRED = Cg * RS;
  const int PQ = P * Q;
  const int M = N * PQ;
  const int g = blockIdx.z;
  const int m0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * BN;
  const int tid = threadIdx.x;

  // ---- the input pixels this thread gathers (fixed for the whole reduction)
  long long a_base[A_LOADS];  // x offset of (image, first channel of the group)
  int a_ih[A_LOADS], a_iw[A_LOADS], a_kk[A_LOADS], a_mm[A_LOADS];
#pragma unroll
  for (int i = 0; i < A_LOADS; ++i) {
    const int e = tid + i * THREADS;
#if NHWC
    a_kk[i] = e % BK;  // reduction fastest: consecutive channels are contiguous
    a_mm[i] = e / BK;
#else
    a_mm[i] = e % BM;  // pixels fastest: consecutive output columns are contiguous
    a_kk[i] = e / BM;
#endif
    const int m = m0 + a_mm[i];
    if (m < M) {
      const int n = m / PQ;
      const int pq = m - n * PQ;
      const int p = pq / Q;
      const int q = pq - p * Q;
      a_ih[i] = p * sh - pt;
      a_iw[i] = q * sw - pl;
#if NHWC
      a_base[i] = (long long)n * H * W * C + (long long)g * Cg;
#else
      a_base[i] = ((long long)n * C + (long long)g * Cg) * H * W;
#endif
    } else {
      a_ih[i] = -(1 << 29);  // every row test fails: zeros
      a_iw[i] = 0;
      a_base[i] = 0;
    }
  }
  // ---- the weights this thread loads: reduction index fastest (contiguous filter rows)
  const elem_t* b_ptr[B_LOADS];
  int b_kk[B_LOADS], b_nn[B_LOADS];
  bool b_ok[B_LOADS];
#pragma unroll
  for (int i = 0; i < B_LOADS; ++i) {
    const int e = tid + i * THREADS;
    b_kk[i] = e % BK;
    b_nn[i] = e / BK;
    const int kn = n0 + b_nn[i];
    b_ok[i] = kn < Kg;
    b_ptr[i] = w + (long long)(g * Kg + (b_ok[i] ? kn : 0)) * KRED;
  }

  float a_reg[A_LOADS], b_reg[B_LOADS];
  auto load_tiles = [&](int k0) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int kred = k0 + a_kk[i];
      float v = 0.f;
      if (kred < KRED) {
#if NHWC
        const int rs = kred / Cg;
        const int c = kred - rs * Cg;
#else
        const int c = kred / RS;
        const int rs = kred - c * RS;
#endif
        const int r = rs / S;
        const int s = rs - r * S;
        const int ih = a_ih[i] + r * dh;
        const int iw = a_iw[i] + s * dw;
        if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) {
#if NHWC
          v = to_float(x[a_base[i] + ((long long)ih * W + iw) * C + c]);
#else
          v = to_float(x[a_base[i] + ((long long)c * H + ih) * W + iw]);
#endif
        }
      }
      a_reg[i] = v;
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int kred = k0 + b_kk[i];
      b_reg[i] = (b_ok[i] && kred < KRED) ? to_float(b_ptr[i][kred]) : 0.f;
    }
  };
  auto store_tiles = [&](int buf) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) As[buf][a_kk[i]][a_mm[i]] = a_reg[i];
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) Bs[buf][b_kk[i]][b_nn[i]] = b_reg[i];
  };

  const int tx = tid % (BN / TN);
  const int ty = tid / (BN / TN);
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  load_tiles(0);
  store_tiles(0);
  __syncthreads();
  int buf = 0;
  for (int k0 = 0; k0 < KRED; k0 += BK) {
    const bool has_next = k0 + BK < KRED;
    if (has_next) load_tiles(k0 + BK);  // global loads in flight during the FMAs below
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[buf][kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[buf][kk][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (has_next) store_tiles(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  // ---- fused epilogue and store
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + ty + i * (BM / TM);
    if (m >= M) continue;
    const int n = m / PQ;
    const int pq = m - n * PQ;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int kn = n0 + tx + j * (BN / TN);
      if (kn >= Kg) continue;
      const int k = g * Kg + kn;
#if NHWC
      const long long yi = (long long)m * K + k;
#else
      const long long yi = ((long long)n * K + k) * PQ + pq;
#endif
      y[yi] = from_float<elem_t>(conv::epilogue(acc[i][j], k, yi, bias, residual, act, flags));
    }
  }
}
