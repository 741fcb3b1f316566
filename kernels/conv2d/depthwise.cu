// conv2d "depthwise" (groups == C, K = C * multiplier): memory-bound, so both kernels read
// every input element once from DRAM and reuse it from registers / shared memory.
//
// dw_nhwc: channels innermost. A thread owns VEC adjacent output channels (one aligned vector
//   access) x TQ adjacent output columns of one output row. For each filter row it loads the
//   SPAN input columns those TQ outputs touch once and feeds every (output, tap) pair that
//   uses them (the pairing is resolved at compile time). Weights of the block's CB channels
//   sit in shared memory tap-major, so a thread's VEC weights are contiguous.
// dw_nchw: planes. A block owns a TH x TW output tile of one (image, channel) plane, stages the
//   input tile it needs (halo included, zero outside the image) in shared memory, and each
//   thread computes TQ outputs of one row, TW/TQ columns apart (bank-conflict free).
//
// Defines: DNNCTL_DTYPE; NHWC (which kernel); KR, KS, STR_H, STR_W, DIL_H, DIL_W (filter,
//   stride and dilation, unrolled); NHWC=1: VEC, CB (channels per block), TQ, THREADS,
//   MULT1 (1 when K == C); NHWC=0: TH, TW, TQ.
#include <dnnctl/conv.cuh>
#include <dnnctl/depthwise_filter.cuh>
#include <dnnctl/depthwise_strip.cuh>

using namespace dnnctl;

#ifndef TQ
#define TQ 2
#endif

#ifndef NHWC
#define NHWC 1
#endif

#if NHWC
// ------------------------------------------------------------------------------- NHWC
#ifndef VEC
#define VEC 1
#endif
#ifndef CB
#define CB 64
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef MULT1
#define MULT1 1
#endif

#define TC (CB / VEC)              // threads across the block's channels
#define TP (THREADS / TC)          // pixel strips per block
#define SPAN ((TQ - 1) * STR_W + (KS - 1) * DIL_W + 1)

static_assert(CB % VEC == 0 && THREADS % (CB / VEC) == 0, "bad NHWC block shape");

extern "C" __global__ void __launch_bounds__(THREADS)
dw_nhwc(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y,
        const elem_t* __restrict__ bias, const elem_t* __restrict__ residual, int N, int C, int H,
        int W, int K, int P, int Q, int pt, int pl, int act, int flags) {
  __shared__ float ws[KR * KS][CB];
  const int tid = threadIdx.x;
  const int kb = blockIdx.y * CB;
  for (int i = tid; i < KR * KS * CB; i += THREADS) {
    const int kl = i % CB;
    const int rs = i / CB;
    const int k = kb + kl;
    ws[rs][kl] = k < K ? to_float(w[(long long)k * (KR * KS) + rs]) : 0.f;
  }
  __syncthreads();

  const int tc = tid % TC;
  const int k0 = kb + tc * VEC;
  const int QS = (Q + TQ - 1) / TQ;
  const long long strips = (long long)N * P * QS;
  const long long strip = (long long)blockIdx.x * TP + tid / TC;
  if (k0 >= K || strip >= strips) return;  // no barrier below this point
  const int n = (int)(strip / ((long long)P * QS));
  const int rem = (int)(strip - (long long)n * P * QS);
  const int p = rem / QS;
  const int q0 = (rem - p * QS) * TQ;

#if !MULT1
  const int mult = K / C;
  int cin[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) cin[v] = (k0 + v) / mult;
#endif

  float acc[TQ][VEC];
#pragma unroll
  for (int t = 0; t < TQ; ++t)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[t][v] = 0.f;

  const int iw0 = q0 * STR_W - pl;
#pragma unroll
  for (int r = 0; r < KR; ++r) {
    const int ih = p * STR_H - pt + r * DIL_H;
    if ((unsigned)ih >= (unsigned)H) continue;
    const elem_t* row = x + ((long long)n * H + ih) * W * C;
    float wr[KS][VEC];  // this filter row's taps for the thread's channels
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int v = 0; v < VEC; ++v) wr[s][v] = ws[r * KS + s][tc * VEC + v];
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
      if (!strip_column_used<TQ>(j)) continue;
      const int iw = iw0 + j;
      float xv[VEC];
      if ((unsigned)iw < (unsigned)W) {
#if MULT1
        conv::load_vec<VEC>(xv, row + (long long)iw * C + k0);
#else
#pragma unroll
        for (int v = 0; v < VEC; ++v) xv[v] = to_float(row[(long long)iw * C + cin[v]]);
#endif
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) xv[v] = 0.f;
      }
      strip_fma<TQ, VEC>(acc, xv, wr, j);
    }
  }
  strip_store<TQ, VEC>(y, acc, (long long)n * P + p, q0, Q, K, k0, bias, residual, act, flags);
}

#else
// ------------------------------------------------------------------------------- NCHW
#ifndef TH
#define TH 8
#endif
#ifndef TW
#define TW 32
#endif
#define NCHW_THREADS (TH * TW / TQ)
#define IH_T ((TH - 1) * STR_H + (KR - 1) * DIL_H + 1)
#define IW_T ((TW - 1) * STR_W + (KS - 1) * DIL_W + 1)

static_assert(TW % TQ == 0, "TQ must divide TW");

extern "C" __global__ void __launch_bounds__(NCHW_THREADS)
dw_nchw(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y,
        const elem_t* __restrict__ bias, const elem_t* __restrict__ residual, int N, int C, int H,
        int W, int K, int P, int Q, int pt, int pl, int act, int flags) {
  __shared__ float tile[IH_T][IW_T];
  __shared__ float wsh[KR * KS];
  const int tid = threadIdx.x;
  const int k = blockIdx.y;
  const int n = blockIdx.z;
  const int tiles_q = (Q + TW - 1) / TW;
  const int p0 = (blockIdx.x / tiles_q) * TH;
  const int q0 = (blockIdx.x % tiles_q) * TW;
  const int c = k / (K / C);
  const elem_t* plane = x + ((long long)n * C + c) * H * W;
  const int ih0 = p0 * STR_H - pt;
  const int iw0 = q0 * STR_W - pl;
  for (int i = tid; i < IH_T * IW_T; i += NCHW_THREADS) {
    const int rr = i / IW_T;
    const int cc = i - rr * IW_T;
    const int ih = ih0 + rr, iw = iw0 + cc;
    tile[rr][cc] = ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
                       ? to_float(plane[(long long)ih * W + iw])
                       : 0.f;
  }
  if (tid < KR * KS) wsh[tid] = to_float(w[(long long)k * (KR * KS) + tid]);
  __syncthreads();

  const int ti = tid / (TW / TQ);
  const int tj = tid % (TW / TQ);
  const int p = p0 + ti;
  if (p >= P) return;
  float wr[KR * KS];
#pragma unroll
  for (int i = 0; i < KR * KS; ++i) wr[i] = wsh[i];
  const long long ybase = (((long long)n * K + k) * P + p) * Q;
#pragma unroll
  for (int t = 0; t < TQ; ++t) {
    const int j = tj + t * (TW / TQ);
    const int q = q0 + j;
    if (q >= Q) break;
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < KR; ++r)
#pragma unroll
      for (int s = 0; s < KS; ++s)
        acc = fmaf(tile[ti * STR_H + r * DIL_H][j * STR_W + s * DIL_W], wr[r * KS + s], acc);
    const long long yi = ybase + q;
    y[yi] = from_float<elem_t>(conv::epilogue(acc, k, yi, bias, residual, act, flags));
  }
}
#endif  // NHWC
