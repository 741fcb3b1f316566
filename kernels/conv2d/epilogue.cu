// conv2d stand-alone epilogue, in place: y = residual + act(y + bias[k]).
// Used after a cuBLAS GEMM wrote the raw convolution into y (im2col_gemm).
// Defines: DNNCTL_DTYPE, NHWC (0/1). Grid-stride over all N*K*P*Q elements.
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
conv_epilogue_inplace(elem_t* __restrict__ y, const elem_t* __restrict__ bias,
                      const elem_t* __restrict__ residual, long long total, int K, int PQ,
                      int act, int flags) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
#if NHWC
    const int k = (int)(i % K);
#else
    const int k = (int)((i / PQ) % K);
#endif
    y[i] = from_float<elem_t>(conv::epilogue(to_float(y[i]), k, i, bias, residual, act, flags));
  }
}
