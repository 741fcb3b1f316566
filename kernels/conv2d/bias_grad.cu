// Column sums of a gradient (the bias gradient), optionally through an activation's
// derivative first, deterministic: a fixed row split, a fixed in-block order, then a
// finish kernel adding the row chunks in order.
//
// Rows m of the gradient: image n = m / PQ, pixel pq = m % PQ; element (m, k) lives at
//   n * img_stride + k * k_stride + pq * pq_stride
// (NHWC conv dy / row-major [M, K]: K-contiguous; NCHW conv dy: pixel-contiguous).
// grad_colsum_partial: grid (ceil(K / 32), chunks), block (32, 8): lane x = column k,
//   lane y = rows m0 + y, m0 + y + 8, ... of its chunk, partial[chunk][k] in float. With
//   GRAD_ACT != 0 (row-major only) it also writes dyp = dy * act'(pre) (the matmul backward's
//   fused pre-pass). A lane walks its rows' (image, pixel) by steps, with no division per
//   element, and loads UNROLL rows before adding them (in row order, so the sum is the same
//   as one row at a time). The host picks the row split from the shape alone
//   (conv2d._cuda.colsum_split), so a shape always sums in the same order.
// grad_colsum_finish: db[k] = sum over chunks of partial[chunk][k] (in chunk order).
// Defines: DNNCTL_DTYPE, GRAD_ACT (0 none, 1 relu, 3 gelu, 5 silu).
#include <dnnctl/colsum.cuh>
#include <dnnctl/conv.cuh>

using namespace dnnctl;

#ifndef GRAD_ACT
#define GRAD_ACT 0
#endif

__device__ __forceinline__ float act_grad(float x) {
  if (GRAD_ACT == ACT_RELU) return x > 0.f ? 1.f : 0.f;
  if (GRAD_ACT == ACT_GELU) {  // Phi(x) + x * phi(x)
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    return cdf + x * 0.39894228040143268f * __expf(-0.5f * x * x);
  }
  if (GRAD_ACT == ACT_SILU) {
    const float sg = 1.f / (1.f + __expf(-x));
    return sg * (1.f + x * (1.f - sg));
  }
  return 1.f;
}

#ifndef UNROLL
#define UNROLL 8
#endif

// A lane's walk over the rows m, m + 8, ... of dy: image n, pixel pq, element offset i.
struct RowWalk {
  long long n;
  int pq;
  __device__ __forceinline__ RowWalk(long long m, int PQ) {
    n = m / PQ;
    pq = (int)(m - n * PQ);
  }
  __device__ __forceinline__ long long offset(int k, long long img_stride, long long k_stride,
                                              long long pq_stride) const {
    return n * img_stride + k * k_stride + pq * pq_stride;
  }
  __device__ __forceinline__ void next(int PQ) {  // m += 8
    pq += 8;
    while (pq >= PQ) {
      pq -= PQ;
      ++n;
    }
  }
};

extern "C" __global__ void __launch_bounds__(256)
grad_colsum_partial(const elem_t* __restrict__ dy, const elem_t* __restrict__ pre,
                    elem_t* __restrict__ dyp, float* __restrict__ partial, long long M, int K,
                    int PQ, long long img_stride, long long k_stride, long long pq_stride,
                    long long rows_per_chunk) {
  __shared__ float red[8][33];
  const int k = (int)blockIdx.x * 32 + (int)threadIdx.x;
  const long long m0 = (long long)blockIdx.y * rows_per_chunk;
  const long long m1 = M < m0 + rows_per_chunk ? M : m0 + rows_per_chunk;
  float acc = 0.f;
  if (k < K) {
    long long m = m0 + threadIdx.y;
    RowWalk walk(m, PQ);
    for (; m + 8 * (UNROLL - 1) < m1; m += 8 * UNROLL) {
      long long i[UNROLL];
      float v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        i[u] = walk.offset(k, img_stride, k_stride, pq_stride);
        walk.next(PQ);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = to_float(dy[i[u]]);
      if (GRAD_ACT != 0) {
        float p[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) p[u] = to_float(pre[i[u]]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          v[u] *= act_grad(p[u]);
          dyp[i[u]] = from_float<elem_t>(v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) acc += v[u];
    }
    for (; m < m1; m += 8) {
      const long long i = walk.offset(k, img_stride, k_stride, pq_stride);
      walk.next(PQ);
      float v = to_float(dy[i]);
      if (GRAD_ACT != 0) {
        v *= act_grad(to_float(pre[i]));
        dyp[i] = from_float<elem_t>(v);
      }
      acc += v;
    }
  }
  const float s = block_colsum_32x8(red, acc);
  if (threadIdx.y == 0 && k < K) partial[(long long)blockIdx.y * K + k] = s;
}

extern "C" __global__ void __launch_bounds__(256)
grad_colsum_finish(const float* __restrict__ partial, elem_t* __restrict__ db, int K,
                   int chunks) {
  for (int k = (int)(blockIdx.x * blockDim.x + threadIdx.x); k < K;
       k += (int)(gridDim.x * blockDim.x)) {
    float s = 0.f;
    for (int c = 0; c < chunks; ++c) s += partial[(long long)c * K + k];
    db[k] = from_float<elem_t>(s);
  }
}
