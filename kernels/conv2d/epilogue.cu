// conv2d stand-alone epilogue, in place: y = residual + act(y + bias[k]), or
// act(y + bias[k] + residual) with conv::EPI_FLAG_RES_BEFORE_ACT.
// Used after a library wrote the raw convolution into y (im2col_gemm's cuBLAS GEMM, the
// cuDNN vendor variant). Defines: DNNCTL_DTYPE, NHWC (0/1), VEC (elements per access, default
// 1). With VEC > 1 the host guarantees that y and residual are VEC-aligned and that one
// vector never crosses a channel boundary it does not expect: NHWC needs K % VEC == 0 (a
// vector holds VEC consecutive channels), NCHW needs P*Q % VEC == 0 (one channel per vector).
// Grid-stride over all N*K*P*Q / VEC vectors.
#include <dnnctl/conv_layout.cuh>

#ifndef VEC
#define VEC 1
#endif

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
conv_epilogue_inplace(elem_t* __restrict__ y, const elem_t* __restrict__ bias,
                      const elem_t* __restrict__ residual, long long total, int K, int PQ,
                      int act, int flags) {
  const long long step = (long long)gridDim.x * blockDim.x;
  const long long nvec = total / VEC;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < nvec; t += step) {
    const long long i = t * VEC;
#if NHWC
    const int k0 = (int)(i % K);
#else
    const int k0 = (int)((i / PQ) % K);
#endif
    float v[VEC], r[VEC];
    conv::load_vec<VEC>(v, y + i);
    const bool res = (flags & conv::EPI_FLAG_RESIDUAL) != 0;
    const bool before = (flags & conv::EPI_FLAG_RES_BEFORE_ACT) != 0;
    if (res) conv::load_vec<VEC>(r, residual + i);
    const int rest = flags & ~(conv::EPI_FLAG_RESIDUAL | conv::EPI_FLAG_RES_BEFORE_ACT);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int k = NHWC ? k0 + j : k0;
      // the residual is added here from the vector already loaded (its flags cleared)
      float o = conv::epilogue(res && before ? v[j] + r[j] : v[j], k, 0, bias, residual,
                               act, rest);
      if (res && !before) o += r[j];
      v[j] = o;
    }
    conv::store_vec<VEC>(y + i, v);
  }
}
