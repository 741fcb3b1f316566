// conv2d layout change for the "nhwc_implicit_gemm" variant: a batch of row-major matrices
// transposed through a shared-memory tile, optionally adding a tensor of the output's shape.
//
//   dst[b][j][i] = src[b][i][j] (+ add[b][j][i])   for b < batch, i < rows, j < cols
//
// NCHW -> NHWC of x: rows = C, cols = H*W, batch = N; weights (K, C/g, R, S) -> (K, R, S, C/g):
// rows = C/g, cols = R*S, batch = K; NHWC -> NCHW of y: rows = P*Q, cols = K, batch = N, with
// the residual added (summed in fp32). A 32 x 32 tile per block of 32 x 8 threads:
// reads and writes run along the contiguous dimension (coalesced); the +1 column of padding
// keeps the column reads of the tile free of bank conflicts.
// Grid: x = tiles (row tiles x column tiles, column tiles fastest), z = batch (<= 65535).
// Defines: DNNCTL_DTYPE.
#include <dnnctl/conv.cuh>

using namespace dnnctl;

#define TT 32  // tile edge
#define TR 8   // thread rows

extern "C" __global__ void __launch_bounds__(TT * TR)
transpose_batched(const elem_t* __restrict__ src, elem_t* __restrict__ dst,
                  const elem_t* __restrict__ add, int rows, int cols, int has_add) {
  __shared__ float tile[TT][TT + 1];
  const int tiles_c = (cols + TT - 1) / TT;
  const int i0 = (int)(blockIdx.x / tiles_c) * TT;
  const int j0 = (int)(blockIdx.x % tiles_c) * TT;
  const long long base = (long long)blockIdx.z * rows * cols;
  const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
#pragma unroll
  for (int di = ty; di < TT; di += TR) {
    const int i = i0 + di, j = j0 + tx;
    if (i < rows && j < cols) tile[di][tx] = to_float(src[base + (long long)i * cols + j]);
  }
  DNNCTL_SYNC();
#pragma unroll
  for (int dj = ty; dj < TT; dj += TR) {
    const int j = j0 + dj, i = i0 + tx;
    if (i < rows && j < cols) {
      const long long o = base + (long long)j * rows + i;
      float v = tile[tx][dj];
      if (has_add) v += to_float(add[o]);
      dst[o] = from_float<elem_t>(v);
    }
  }
}
