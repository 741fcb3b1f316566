// dnnctl GEMM-core kernels' -D macros (kernels/gemm/*.cu, the conv2d implicit GEMMs): their
// defaults, and the Epilogue the EPI_* macros select. The launch code passes every macro a
// kernel reads; the defaults let a file compile on its own (tools/nvrtc_check.py): 16-byte
// loads, a 128 x 128 tile (128 x 256 on wgmma). A kernel with other defaults defines them
// before the include. Include as <dnnctl/gemm_macros.cuh>.
//
//   EPI_ACT      activation code (ACT_*, dnnctl/common.cuh)
//   EPI_BIAS     BIAS_NONE | BIAS_COL | BIAS_ROW          (dnnctl/epilogue.cuh)
//   EPI_RES      ResMode: 0 none, 1 add the residual after the activation, 2 before it
//   EPI_OUT      OUT_STORE | OUT_PARTIAL | OUT_ATOMIC | OUT_FUSED
//   EPI_PAIR     1: ldc and offsets even, stores two columns at once
//   GEMM_MATH    MATH_MMA16 | MATH_TF32 | MATH_SIMT        (dnnctl/gemm_core.cuh)
//   GEMM_BM, GEMM_BN, GEMM_BK, GEMM_WM, GEMM_WN, GEMM_STAGES   tile, warps, pipeline depth
//   GEMM_VEC_A, GEMM_VEC_B   elements per global load of A / B
//   GEMM_A_KMAJOR, GEMM_B_KMAJOR   matmul: 1 when K is the contiguous index of A / B
#pragma once
#include <dnnctl/epilogue.cuh>

#ifndef EPI_ACT
#define EPI_ACT 0
#endif
#ifndef EPI_BIAS
#define EPI_BIAS 0
#endif
#ifndef EPI_RES
#define EPI_RES 0
#endif
#ifndef EPI_OUT
#define EPI_OUT 0
#endif
#ifndef EPI_PAIR
#define EPI_PAIR 0
#endif

#ifndef GEMM_MATH
#define GEMM_MATH 0
#endif
#ifndef GEMM_BM
#ifdef DNNCTL_WGMMA_CORE  // dnnctl/wgmma_core.cuh: two consumer warpgroups
#define GEMM_BM 128
#define GEMM_BN 256
#define GEMM_WM 8
#define GEMM_STAGES 4
#else
#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 32
#define GEMM_WM 2
#define GEMM_WN 2
#define GEMM_STAGES 3
#endif
#endif
#ifndef GEMM_VEC_A
#define GEMM_VEC_A (16 / (int)sizeof(elem_t))
#endif
#ifndef GEMM_VEC_B
#define GEMM_VEC_B (16 / (int)sizeof(elem_t))
#endif
#ifndef GEMM_A_KMAJOR
#define GEMM_A_KMAJOR 1
#endif
#ifndef GEMM_B_KMAJOR
#define GEMM_B_KMAJOR 0
#endif

namespace dnnctl {

// The epilogue of the EPI_* macros with output mode OUT (EPI_OUT; OUT_STORE for a split-K
// finish) and output layout LAYOUT (0 row-major, 1 NCHW conv output).
template <int OUT = EPI_OUT, int LAYOUT = 0>
using MacroEpilogue = Epilogue<elem_t, EPI_ACT, EPI_BIAS, EPI_RES, OUT, LAYOUT, EPI_PAIR != 0>;

}  // namespace dnnctl
