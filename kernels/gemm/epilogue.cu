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
  const long long step = (long long)gridDim.x * blockDim.x;
  // A dense row-major output whose rows hold whole groups of four: four elements per thread
  // (one 16-byte load per slab, one store of four outputs), the same sums in the same order
  constexpr unsigned long long OUT4 = 4 * sizeof(elem_t) - 1;
  if (EPI_LAYOUT == 0 && ldc == N && sC == mn && (N & 3) == 0 &&
      ((unsigned long long)C & OUT4) == 0 && ((unsigned long long)ws & 15) == 0 &&
      (EPI_RES == 0 || ((unsigned long long)res & OUT4) == 0)) {
    struct alignas(4 * sizeof(elem_t)) Out4 { elem_t v[4]; };
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total >> 2;
         t += step) {
      const long long i = t << 2;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < splits; ++s) {
        const float4 u = ldg(reinterpret_cast<const float4*>(ws + s * slab + i));
        v.x += u.x;
        v.y += u.y;
        v.z += u.z;
        v.w += u.w;
      }
      const long long bz = i / mn;
      const long long rem = i - bz * mn;
      const int row = (int)(rem / N), col = (int)(rem - (long long)row * N);
      e.c_off = bz * sC;
      e.bias_off = bz * s_bias;
      const long long idx = e.out_index(row, col);
      Out4 o;
      o.v[0] = from_float<elem_t>(e.finish(row, col, idx, v.x));
      o.v[1] = from_float<elem_t>(e.finish(row, col + 1, idx + 1, v.y));
      o.v[2] = from_float<elem_t>(e.finish(row, col + 2, idx + 2, v.z));
      o.v[3] = from_float<elem_t>(e.finish(row, col + 3, idx + 3, v.w));
      stg(reinterpret_cast<Out4*>(C + idx), o);
    }
    return;
  }
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
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

// gemm_epilogue_inplace: y = act(y + bias) in place over `batch` dense row-major M x N
// products (what follows a library GEMM that wrote y in the output dtype: the product is
// rounded once before the epilogue, as an unfused linear + activation rounds it). The bias
// element of (row, col) is bias[b * s_bias + col]. VEC elements per thread (N % VEC == 0, y
// and bias aligned for it; VEC 1 otherwise). Defines: DNNCTL_DTYPE, EPI_ACT, EPI_BIAS, VEC.
#ifndef VEC
#define VEC 1
#endif

extern "C" __global__ void __launch_bounds__(256)
    gemm_epilogue_inplace(elem_t* y, const elem_t* bias, long long mn, int N,
                          long long total, long long s_bias) {
  struct alignas(VEC * sizeof(elem_t)) Vec { elem_t v[VEC]; };
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total / VEC;
       t += step) {
    const long long i = t * VEC;
    Vec o = ldg(reinterpret_cast<const Vec*>(y + i));
    const long long bz = i / mn;
    const int col = (int)((i - bz * mn) % N);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float v = to_float(o.v[j]);
      if (EPI_BIAS == BIAS_COL) v += to_float(ldg(bias + bz * s_bias + col + j));
      o.v[j] = from_float<elem_t>(activate<EPI_ACT>(v));
    }
    stg(reinterpret_cast<Vec*>(y + i), o);
  }
}
