// batch_norm inference, channel-stationary: NCHW a block per (plane, split) with its channel's
// parameters in registers (bn_planes); NHWC threads pinned to a channel vector walking rows
// (bn_rows). Kernels in <dnnctl/batchnorm.cuh>; compile with PARAMS=0.
#include <dnnctl/batchnorm.cuh>
