// dnnctl GEMM epilogue kernels: finish a split-K (or cuBLAS fp32) result.
//
// splitk_finish: y = epilogue(sum over s of ws[s]) for every element of `batch` GEMMs of
// M x N, the fp32 slabs laid out [split][batch][M][N] (summed in split order, so the result
// is deterministic). The epilogue (bias, activation, residual, output layout) is the one the
// main kernels fuse; see dnnctl/epilogue.cuh. Defines: DNNCTL_DTYPE, EPI_ACT, EPI_BIAS,
// EPI_RES, EPI_LAYOUT (0 row-major, 1 NCHW conv output).
#include <dnnctl/gemm_grid.cuh>
#include <dnnctl/gemm_macros.cuh>

using namespace dnnctl;

#ifndef EPI_LAYOUT
#define EPI_LAYOUT 0
#endif

typedef MacroEpilogue<OUT_STORE, EPI_LAYOUT> Epi;

extern "C" __global__ void __launch_bounds__(256)
    splitk_finish(const float* ws, elem_t* C, const elem_t* bias, const elem_t* res, int M,
                  int N, int batch, int splits, long long ldc, long long sC, long long s_bias,
                  long long pq, long long img_stride) {
  Epi e;  // this batch's c_off and bias_off are set per element below
  init_epilogue(e, C, bias, res, (float*)nullptr, M, N, ldc, 0, 0, 0, pq, img_stride);
  const long long mn = (long long)M * N;
  const long long total = mn * batch;
  const long long slab = total;  // elements per split
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += ldg(ws + s * slab + i);
    const long long bz = i / mn;
    const long long rem = i - bz * mn;
    const int row = (int)(rem / N), col = (int)(rem - (long long)row * N);
    e.c_off = bz * sC;
    e.bias_off = bz * s_bias;
    e.store1(row, col, v);
  }
}
