// dnnctl conv2d helpers shared by kernels/conv2d/*.cu: the fused epilogue and vector I/O.
// NVRTC-compatible (no host headers). Include as <dnnctl/conv.cuh>.
#pragma once
#include <dnnctl/common.cuh>

// Block-wide barrier. Built with -DDNNCTL_EMU (the CPU emulator of tools/cuda_emu) it is the
// emulator's fiber barrier; on the GPU plain __syncthreads().
#ifdef DNNCTL_EMU
#define DNNCTL_SYNC() emu::block_barrier()
#else
#define DNNCTL_SYNC() __syncthreads()
#endif

namespace dnnctl {
namespace conv {

// Epilogue flags passed at run time (one compiled kernel serves every epilogue): the same
// terms as the compile-time EPI_BIAS / EPI_RES macros of the GEMM kernels (gemm_macros.cuh),
// named apart so no name means both a macro and a run-time bit.
// EPI_FLAG_RES_BEFORE_ACT (with EPI_FLAG_RESIDUAL): the residual goes in before the
// activation (EPI_RES = RES_BEFORE_ACT of the GEMM kernels).
enum EpiFlag { EPI_FLAG_BIAS = 1, EPI_FLAG_RESIDUAL = 2, EPI_FLAG_RES_BEFORE_ACT = 4 };

// y = residual + act(acc + bias[k]), or act(acc + bias[k] + residual) with
// EPI_FLAG_RES_BEFORE_ACT; act is an ACT_* code (none, relu, gelu, silu, relu6, hardswish).
// yi indexes the residual, which has y's shape and layout.
__device__ __forceinline__ float epilogue(float v, int k, long long yi, const elem_t* bias,
                                          const elem_t* residual, int act, int flags) {
  if (flags & EPI_FLAG_BIAS) v += to_float(bias[k]);
  const bool res = (flags & EPI_FLAG_RESIDUAL) != 0;
  const bool before = (flags & EPI_FLAG_RES_BEFORE_ACT) != 0;
  if (res && before) v += to_float(residual[yi]);
  switch (act) {
    case ACT_RELU: v = activate<ACT_RELU>(v); break;
    case ACT_GELU: v = activate<ACT_GELU>(v); break;
    case ACT_SILU: v = activate<ACT_SILU>(v); break;
    case ACT_RELU6: v = activate<ACT_RELU6>(v); break;
    case ACT_HARDSWISH: v = activate<ACT_HARDSWISH>(v); break;
    default: break;
  }
  if (res && !before) v += to_float(residual[yi]);
  return v;
}

// NV elements moved as one aligned access (NV * sizeof(elem_t) in {2, 4, 8, 16} bytes).
template <int NV>
struct alignas(NV * sizeof(elem_t)) Vec {
  elem_t v[NV];
};

template <int NV>
__device__ __forceinline__ void load_vec(float (&out)[NV], const elem_t* p) {
  const Vec<NV> t = *reinterpret_cast<const Vec<NV>*>(p);
#pragma unroll
  for (int i = 0; i < NV; ++i) out[i] = to_float(t.v[i]);
}

template <int NV>
__device__ __forceinline__ void store_vec(elem_t* p, const float (&in)[NV]) {
  Vec<NV> t;
#pragma unroll
  for (int i = 0; i < NV; ++i) t.v[i] = from_float<elem_t>(in[i]);
  *reinterpret_cast<Vec<NV>*>(p) = t;
}

__device__ __forceinline__ int div_up(int a, int b) { return (a + b - 1) / b; }

}  // namespace conv
}  // namespace dnnctl
