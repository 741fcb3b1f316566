// dnnctl conv2d channel padding for the wgmma implicit GEMM: copies a channels-last tensor
// of `rows` pixels x groups x cg channels into rows x groups x cgp (cgp > cg, a multiple of
// 4), the extra channels zero. Used for the NHWC input (rows = N*H*W) and the weight
// (rows = K*R*S, groups 1), so the padded channels contribute exactly 0 to every output.
// One thread per (row, group): reads cg elements, writes cgp. Defines: DNNCTL_DTYPE.
#include <dnnctl/ptx.cuh>

using namespace dnnctl;

extern "C" __global__ void __launch_bounds__(256)
    pad_channels(const elem_t* src, elem_t* dst, long long rows, int groups, int cg, int cgp) {
  const long long total = rows * groups;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const elem_t* in = src + i * cg;
    elem_t* out = dst + i * cgp;
    for (int c = 0; c < cgp; ++c) stg(out + c, c < cg ? ldg(in + c) : from_float<elem_t>(0.f));
  }
}
