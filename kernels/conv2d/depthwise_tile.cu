// conv2d depthwise (groups == C == K), NHWC, tiled through shared memory: dw_tile_nhwc.
//
// A block owns a TH x TW tile of output pixels of one image for CB channels. It stages the
// input window those outputs read (IH x IW pixels: the tile, its halo and the stride's gaps;
// zero outside the image and past the last channel) in shared memory once, in the I/O type,
// so every input element comes from DRAM once per tile (the halo's share is
// (IH * IW) / (TH * TW) - 1), and the KR x KS taps re-read it from shared memory rather than
// from L1 / L2 (dw_nhwc in depthwise.cu re-reads each input row once per output row).
//
// A thread owns VEC adjacent channels (one 16-byte access) x TQ adjacent output columns of
// one tile row. Per filter row it reads the SPAN tile columns its TQ outputs touch once and
// feeds every (output, tap) pair that uses them (the pairing is resolved at compile time,
// as in dw_nhwc); the filter row's taps for its channels are read from shared memory
// (float, tap-major). fp32 accumulation, then the conv2d epilogue (bias, activation,
// residual).
//
// Shared-memory layout: tile[IH][IW][CBP] with CBP = CB + PADC elements per pixel: the pad
// moves the pixel TQ columns over (the next thread group of a quarter warp) off the banks of
// the first (16-byte accesses are served a quarter warp at a time).
//
// The same kernel is the data gradient of a stride-1 depthwise convolution (FLIP = 1): dx is
// dy correlated with the filter turned 180 degrees, padded by (KR - 1) * DIL_H - pt on top
// and (KS - 1) * DIL_W - pl on the left (the host passes dy as x, dx as y and those pads).
//
// Defines: DNNCTL_DTYPE, KR, KS, STR_H, STR_W, DIL_H, DIL_W (unrolled), VEC, CB, TH, TW, TQ,
// FLIP (0: the forward; 1: the filter turned 180 degrees).
// Threads per block: (CB / VEC) * TH * (TW / TQ). Grid: (N * tiles_p * tiles_q, ceil(K / CB)).
// Host: K == C, K % VEC == 0, x / y 16-byte aligned when VEC > 1 (else VEC = 1).
#include <dnnctl/conv.cuh>
#include <dnnctl/depthwise_filter.cuh>
#include <dnnctl/depthwise_strip.cuh>

using namespace dnnctl;

#ifndef VEC
#define VEC 8
#endif
#ifndef CB
#define CB 32
#endif
#ifndef TH
#define TH 8
#endif
#ifndef TW
#define TW 16
#endif
#ifndef TQ
#define TQ 4
#endif
#ifndef FLIP
#define FLIP 0
#endif

#define TCH (CB / VEC)                                   // threads across the channels
#define TJ (TW / TQ)                                     // thread columns across the tile
#define DW_THREADS (TCH * TH * TJ)
#define IH ((TH - 1) * STR_H + (KR - 1) * DIL_H + 1)     // input rows the tile reads
#define IW ((TW - 1) * STR_W + (KS - 1) * DIL_W + 1)     // input columns the tile reads
#define SPAN ((TQ - 1) * STR_W + (KS - 1) * DIL_W + 1)   // input columns one thread reads
#define PADC (16 / (int)sizeof(elem_t))                  // one 16-byte pad per pixel
#define CBP (CB + PADC)

static_assert(CB % VEC == 0 && TW % TQ == 0, "CB % VEC and TW % TQ must be 0");
static_assert(DW_THREADS >= 32 && DW_THREADS <= 1024, "threads per block out of range");

// VEC elements of the I/O type as one aligned access (VEC * sizeof(elem_t) bytes).
template <int NV>
struct alignas(NV * sizeof(elem_t)) Pack {
  elem_t v[NV];
};

extern "C" __global__ void __launch_bounds__(DW_THREADS)
dw_tile_nhwc(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
             elem_t* __restrict__ y, const elem_t* __restrict__ bias,
             const elem_t* __restrict__ residual, int N, int C, int H, int W, int K, int P,
             int Q, int pt, int pl, int act, int flags) {
  __shared__ __align__(16) elem_t tile[IH * IW * CBP];
  __shared__ __align__(16) float ws[KR * KS][CB];
  const int tid = threadIdx.x;
  const int kb = blockIdx.y * CB;
  const int tiles_q = (Q + TW - 1) / TW;
  const int tiles_p = (P + TH - 1) / TH;
  const int n = blockIdx.x / (tiles_p * tiles_q);
  const int rem = blockIdx.x - n * tiles_p * tiles_q;
  const int p0 = (rem / tiles_q) * TH;
  const int q0 = (rem - (rem / tiles_q) * tiles_q) * TW;
  const int ih0 = p0 * STR_H - pt;
  const int iw0 = q0 * STR_W - pl;

  // stage the input window: IH * IW pixels x TCH vectors, zero outside the image / channels
  const elem_t* img = x + (long long)n * H * W * C;
  for (int i = tid; i < IH * IW * TCH; i += DW_THREADS) {
    const int cv = i % TCH;
    const int pix = i / TCH;
    const int rr = pix / IW;
    const int cc = pix - rr * IW;
    const int ih = ih0 + rr, iw = iw0 + cc;
    const int k = kb + cv * VEC;
    Pack<VEC> v;
    if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W && k < K) {
      v = *reinterpret_cast<const Pack<VEC>*>(img + ((long long)ih * W + iw) * C + k);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) v.v[e] = from_float<elem_t>(0.f);
    }
    *reinterpret_cast<Pack<VEC>*>(tile + pix * CBP + cv * VEC) = v;
  }
  for (int i = tid; i < KR * KS * CB; i += DW_THREADS) {
    const int kl = i % CB;
    const int rs = i / CB;
    const int k = kb + kl;
    const int src = FLIP ? KR * KS - 1 - rs : rs;  // (KR-1-r, KS-1-s) for the data gradient
    ws[rs][kl] = k < K ? to_float(w[(long long)k * (KR * KS) + src]) : 0.f;
  }
  __syncthreads();

  const int tc = tid % TCH;
  const int tj = (tid / TCH) % TJ;
  const int ti = tid / (TCH * TJ);
  const int k0 = kb + tc * VEC;
  const int p = p0 + ti;
  const int qa = q0 + tj * TQ;
  if (k0 >= K || p >= P || qa >= Q) return;  // no barrier below this point

  float acc[TQ][VEC];
#pragma unroll
  for (int t = 0; t < TQ; ++t)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[t][v] = 0.f;

  const int col0 = tj * TQ * STR_W;  // the thread's first tile column
#pragma unroll
  for (int r = 0; r < KR; ++r) {
    const elem_t* row = tile + ((ti * STR_H + r * DIL_H) * IW + col0) * CBP + tc * VEC;
    float wr[KS][VEC];
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int v = 0; v < VEC; ++v) wr[s][v] = ws[r * KS + s][tc * VEC + v];
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
      if (!strip_column_used<TQ>(j)) continue;
      const Pack<VEC> pk = *reinterpret_cast<const Pack<VEC>*>(row + j * CBP);
      float xv[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) xv[v] = to_float(pk.v[v]);
      strip_fma<TQ, VEC>(acc, xv, wr, j);
    }
  }
  strip_store<TQ, VEC>(y, acc, (long long)n * P + p, qa, Q, K, k0, bias, residual, act, flags);
}
