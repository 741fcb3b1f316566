// conv2d depthwise (groups == C == K), NHWC, tiled through shared memory: dw_tile_nhwc.
//
// A block owns TPB consecutive TH x TW tiles of output pixels for CB channels. For each tile
// it stages the input window those outputs read (IH x IW pixels: the tile, its halo and the
// stride's gaps; zero outside the image and past the last channel) in shared memory, in the
// I/O type, so every input element comes from DRAM once per tile (the halo's share is
// (IH * IW) / (TH * TW) - 1), and the KR x KS taps re-read it from shared memory rather than
// from L1 / L2 (dw_nhwc in depthwise.cu re-reads each input row once per output row).
//
// The window is staged with cp.async (16-, 8- or 4-byte copies, zero-filled outside the
// image): every copy of a tile is in flight at once, so a tile pays one DRAM latency, not one
// per copy a thread makes. With TPB > 1 two windows alternate: the next tile's copies fly
// while this tile's taps run. The block's filter taps (float, tap-major) are read once.
//
// A thread owns VEC adjacent channels (one 16-byte access) x TQ adjacent output columns of
// one tile row. Per filter row it reads the SPAN tile columns its TQ outputs touch once and
// feeds every (output, tap) pair that uses them (the pairing is resolved at compile time,
// as in dw_nhwc). fp32 accumulation, then the conv2d epilogue (bias, activation, residual).
//
// Shared memory (dynamic, the host computes its size): taps[KR * KS][CB] (float), then NBUF
// windows tile[IH][IW][CBP], CBP = CB + PADC elements per pixel: the pad (PAD_BYTES)
// moves the pixel TQ columns over (the next thread group of a quarter warp) off the banks of
// the first (16-byte accesses are served a quarter warp at a time).
//
// The same kernel is the data gradient of a stride-1 depthwise convolution (FLIP = 1): dx is
// dy correlated with the filter turned 180 degrees, padded by (KR - 1) * DIL_H - pt on top
// and (KS - 1) * DIL_W - pl on the left (the host passes dy as x, dx as y and those pads).
//
// Defines: DNNCTL_DTYPE, KR, KS, STR_H, STR_W, DIL_H, DIL_W (unrolled), VEC, CB, TH, TW, TQ,
// TPB (tiles per block), PAD_BYTES, FLIP (0: the forward; 1: the filter turned 180 degrees).
// Threads per block: (CB / VEC) * TH * (TW / TQ). Grid: (ceil(N * tiles_p * tiles_q / TPB),
// ceil(K / CB)). Host: K == C, K % VEC == 0, x / y VEC-element aligned.
#include <dnnctl/conv.cuh>
#include <dnnctl/depthwise_filter.cuh>
#include <dnnctl/depthwise_strip.cuh>
#include <dnnctl/ptx.cuh>

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
#ifndef TPB
#define TPB 1
#endif
#ifndef FLIP
#define FLIP 0
#endif
// The pad after each staged pixel's CB channels (bytes, a multiple of 16) that spreads a
// quarter warp's window reads over the banks: chosen by the host (_tile_pad_bytes in
// dnnctl/ops/conv2d/depthwise.py), which sizes the shared memory with it.
#ifndef PAD_BYTES
#define PAD_BYTES 16
#endif

#define TCH (CB / VEC)                                   // threads across the channels
#define TJ (TW / TQ)                                     // thread columns across the tile
#define DW_THREADS (TCH * TH * TJ)
#define IH ((TH - 1) * STR_H + (KR - 1) * DIL_H + 1)     // input rows the tile reads
#define IW ((TW - 1) * STR_W + (KS - 1) * DIL_W + 1)     // input columns the tile reads
#define SPAN ((TQ - 1) * STR_W + (KS - 1) * DIL_W + 1)   // input columns one thread reads
#define PADC (PAD_BYTES / (int)sizeof(elem_t))          // pad elements per pixel
#define CBP (CB + PADC)
#define NBUF (TPB > 1 ? 2 : 1)                           // windows in flight
#define WIN_ELEMS (IH * IW * CBP)
#define TAP_BYTES (KR * KS * CB * 4)                     // a multiple of 16 (CB % 4 == 0)


static_assert(CB % VEC == 0 && TW % TQ == 0, "CB % VEC and TW % TQ must be 0");
static_assert(CB % 4 == 0, "CB must be a multiple of 4 (16-byte aligned windows)");
static_assert(DW_THREADS >= 32 && DW_THREADS <= 1024, "threads per block out of range");

// VEC elements of the I/O type as one aligned access (VEC * sizeof(elem_t) bytes).
template <int NV>
struct alignas(NV * sizeof(elem_t)) Pack {
  elem_t v[NV];
};

constexpr int PACK_BYTES = VEC * (int)sizeof(elem_t);

// A tile's first output pixel: image n, row p0, column q0.
struct TileAt {
  int n, p0, q0;
};

__device__ __forceinline__ TileAt tile_at(int t, int tiles_q, int tiles_pq) {
  TileAt a;
  a.n = t / tiles_pq;
  const int rem = t - a.n * tiles_pq;
  const int tp = rem / tiles_q;
  a.p0 = tp * TH;
  a.q0 = (rem - tp * tiles_q) * TW;
  return a;
}

// Stage tile t's input window into `win` (asynchronously where the pack is 4 bytes or more).
__device__ __forceinline__ void stage_window(const elem_t* __restrict__ x, elem_t* win,
                                             TileAt a, int kb, int tid, int C, int H, int W,
                                             int K, int pt, int pl) {
  const int ih0 = a.p0 * STR_H - pt;
  const int iw0 = a.q0 * STR_W - pl;
  const elem_t* img = x + (long long)a.n * H * W * C;
  for (int i = tid; i < IH * IW * TCH; i += DW_THREADS) {
    const int cv = i % TCH;
    const int pix = i / TCH;
    const int rr = pix / IW;
    const int cc = pix - rr * IW;
    const int ih = ih0 + rr, iw = iw0 + cc;
    const int k = kb + cv * VEC;
    const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W && k < K;
    elem_t* dst = win + pix * CBP + cv * VEC;
    if constexpr (PACK_BYTES >= 4) {
      const elem_t* src = ok ? img + ((long long)ih * W + iw) * C + k : x;
      cp_async<PACK_BYTES>(dst, src, ok);
    } else {
      Pack<VEC> v;
      if (ok) {
        v = *reinterpret_cast<const Pack<VEC>*>(img + ((long long)ih * W + iw) * C + k);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v.v[e] = from_float<elem_t>(0.f);
      }
      *reinterpret_cast<Pack<VEC>*>(dst) = v;
    }
  }
}

extern "C" __global__ void __launch_bounds__(DW_THREADS)
dw_tile_nhwc(const elem_t* __restrict__ x, const elem_t* __restrict__ w,
             elem_t* __restrict__ y, const elem_t* __restrict__ bias,
             const elem_t* __restrict__ residual, int N, int C, int H, int W, int K, int P,
             int Q, int pt, int pl, int act, int flags) {
  DNNCTL_DECLARE_SMEM(smem);
  float* ws = reinterpret_cast<float*>(smem);                  // [KR * KS][CB]
  elem_t* wins = reinterpret_cast<elem_t*>(smem + TAP_BYTES);  // NBUF windows
  const int tid = threadIdx.x;
  const int kb = blockIdx.y * CB;
  const int tiles_q = (Q + TW - 1) / TW;
  const int tiles_pq = ((P + TH - 1) / TH) * tiles_q;
  const int first = blockIdx.x * TPB;
  const int left = N * tiles_pq - first;
  const int count = left < TPB ? left : TPB;

  stage_window(x, wins, tile_at(first, tiles_q, tiles_pq), kb, tid, C, H, W, K, pt, pl);
  cp_async_commit();
  for (int i = tid; i < KR * KS * CB; i += DW_THREADS) {
    const int kl = i % CB;
    const int rs = i / CB;
    const int k = kb + kl;
    const int src = FLIP ? KR * KS - 1 - rs : rs;  // (KR-1-r, KS-1-s) for the data gradient
    ws[rs * CB + kl] = k < K ? to_float(w[(long long)k * (KR * KS) + src]) : 0.f;
  }

  const int tc = tid % TCH;
  const int tj = (tid / TCH) % TJ;
  const int ti = tid / (TCH * TJ);
  const int k0 = kb + tc * VEC;
  for (int it = 0; it < count; ++it) {
    if (it + 1 < count) {  // the next window's copies fly while this tile's taps run
      stage_window(x, wins + ((it + 1) % NBUF) * WIN_ELEMS,
                   tile_at(first + it + 1, tiles_q, tiles_pq), kb, tid, C, H, W, K, pt, pl);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    DNNCTL_SYNC();
    const TileAt a = tile_at(first + it, tiles_q, tiles_pq);
    const int p = a.p0 + ti;
    const int qa = a.q0 + tj * TQ;
    if (k0 < K && p < P && qa < Q) {
      const elem_t* win = wins + (it % NBUF) * WIN_ELEMS;
      float acc[TQ][VEC];
#pragma unroll
      for (int t = 0; t < TQ; ++t)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[t][v] = 0.f;

      const int col0 = tj * TQ * STR_W;  // the thread's first window column
#pragma unroll
      for (int r = 0; r < KR; ++r) {
        const elem_t* row = win + ((ti * STR_H + r * DIL_H) * IW + col0) * CBP + tc * VEC;
        float wr[KS][VEC];
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
          for (int v = 0; v < VEC; ++v) wr[s][v] = ws[(r * KS + s) * CB + tc * VEC + v];
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
      strip_store<TQ, VEC>(y, acc, (long long)a.n * P + p, qa, Q, K, k0, bias, residual, act,
                           flags);
    }
    if (it + 1 < count) DNNCTL_SYNC();  // this window is staged again two tiles on
  }
}
