// dnnctl fused GEMM / convolution epilogue: y = act(acc + bias) + residual (RES_AFTER_ACT),
// or y = act(acc + bias + residual) (RES_BEFORE_ACT: a ResNet block's end), stored in the
// output dtype; or, for split-K, the raw fp32 partial sums (own slab, or atomically added).
//
// Coordinates are those of one GEMM "batch" (a matmul batch, a convolution group or an
// image): row in [0, M), col in [0, N). The output element of (row, col) is
//   OUT_LAYOUT 0 (row-major):  C[c_off + row * ldc + col]
//   OUT_LAYOUT 1 (NCHW conv):  C[c_off + (row / PQ) * img_stride + col * PQ + row % PQ]
// the bias element is bias[bias_off + col] (BIAS_MODE 1) or bias[bias_off + row] (2), and
// the residual is read at the output's index. Included by the conv kernels too.
#pragma once
#include <dnnctl/ptx.cuh>

namespace dnnctl {

enum BiasMode { BIAS_NONE = 0, BIAS_COL = 1, BIAS_ROW = 2 };
// where the residual is added (EPI_RES): none, after the activation, before it
enum ResMode { RES_NONE = 0, RES_AFTER_ACT = 1, RES_BEFORE_ACT = 2 };
// OUT_FUSED: store the partial like OUT_PARTIAL; the kernel then lets the last split of
// each tile sum the partials and run the OUT_STORE epilogue (splitk_fused_finish).
enum OutMode { OUT_STORE = 0, OUT_PARTIAL = 1, OUT_ATOMIC = 2, OUT_FUSED = 3 };

template <typename T, int ACT, int BIAS_MODE, int RES, int OUT_MODE, int OUT_LAYOUT,
          bool PAIR>
struct Epilogue {
  T* c;
  const T* bias;
  const T* res;
  float* ws;
  int m, n;
  long long ldc;
  long long c_off;      // this batch's output offset (elements)
  long long bias_off;   // this batch's bias offset
  long long ws_off;     // this batch's (and split's) fp32 slab offset, m * n elements each
  long long pq;         // OUT_LAYOUT 1: output pixels per image
  long long img_stride; // OUT_LAYOUT 1: elements per output image (K * PQ)

  __device__ __forceinline__ long long out_index(int row, int col) const {
    if (OUT_LAYOUT == 0) return c_off + (long long)row * ldc + col;
    const long long img = row / pq;
    return c_off + img * img_stride + (long long)col * pq + (row - img * pq);
  }

  __device__ __forceinline__ float finish(int row, int col, long long idx, float v) const {
    if (BIAS_MODE == BIAS_COL) v += to_float(ldg(bias + bias_off + col));
    if (BIAS_MODE == BIAS_ROW) v += to_float(ldg(bias + bias_off + row));
    if (RES == RES_BEFORE_ACT) v += to_float(ldg(res + idx));
    v = activate<ACT>(v);
    if (RES == RES_AFTER_ACT) v += to_float(ldg(res + idx));
    return v;
  }

  // One element; (row, col) must be inside [0, m) x [0, n).
  __device__ __forceinline__ void store1(int row, int col, float v) const {
    if (OUT_MODE == OUT_PARTIAL || OUT_MODE == OUT_FUSED) {
      stg(ws + ws_off + (long long)row * n + col, v);
    } else if (OUT_MODE == OUT_ATOMIC) {
      atomic_add(ws + ws_off + (long long)row * n + col, v);
    } else {
      const long long idx = out_index(row, col);
      stg(c + idx, from_float<T>(finish(row, col, idx, v)));
    }
  }

  // Columns col (even) and col + 1 of one row; either may lie outside the matrix.
  __device__ __forceinline__ void store2(int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    const bool both = col + 1 < n;
    if (PAIR && OUT_LAYOUT == 0 && both) {
      if (OUT_MODE == OUT_PARTIAL || OUT_MODE == OUT_FUSED) {
        float2 p;
        p.x = v0;
        p.y = v1;
        stg(reinterpret_cast<float2*>(ws + ws_off + (long long)row * n + col), p);
        return;
      }
      if (OUT_MODE == OUT_STORE) {
        const long long idx = out_index(row, col);
        if (BIAS_MODE == BIAS_COL) {
          v0 += to_float(ldg(bias + bias_off + col));
          v1 += to_float(ldg(bias + bias_off + col + 1));
        }
        if (BIAS_MODE == BIAS_ROW) {
          const float b = to_float(ldg(bias + bias_off + row));
          v0 += b;
          v1 += b;
        }
        if (RES == RES_BEFORE_ACT) add_pair(idx, v0, v1);
        v0 = activate<ACT>(v0);
        v1 = activate<ACT>(v1);
        if (RES == RES_AFTER_ACT) add_pair(idx, v0, v1);
        store_pair(idx, v0, v1);
        return;
      }
    }
    store1(row, col, v0);
    if (both) store1(row, col + 1, v1);
  }

  // Two adjacent residual elements (idx even, so 2-element aligned) added, one load.
  __device__ __forceinline__ void add_pair(long long idx, float& v0, float& v1) const {
    if (sizeof(T) == 4) {
      const float2 r = ldg(reinterpret_cast<const float2*>(res + idx));
      v0 += r.x;
      v1 += r.y;
    } else {
      const unsigned r = ldg(reinterpret_cast<const unsigned*>(res + idx));
      const unsigned short lo = static_cast<unsigned short>(r & 0xffffu);
      const unsigned short hi = static_cast<unsigned short>(r >> 16);
      v0 += to_float(*reinterpret_cast<const T*>(&lo));
      v1 += to_float(*reinterpret_cast<const T*>(&hi));
    }
  }

  // Two adjacent output elements (idx even, so 2-element aligned): one store.
  __device__ __forceinline__ void store_pair(long long idx, float v0, float v1) const {
    if (sizeof(T) == 4) {
      float2 p;
      p.x = v0;
      p.y = v1;
      stg(reinterpret_cast<float2*>(c + idx), p);
    } else {
      stg(reinterpret_cast<unsigned*>(c + idx), pack2(from_float<T>(v0), from_float<T>(v1)));
    }
  }
};

}  // namespace dnnctl
