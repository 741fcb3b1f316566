// dnnctl layout switch of the element-wise conv2d kernels (col2im, dgrad_phase, direct_bwd,
// epilogue, fft, im2col, winograd in kernels/conv2d/): -D NHWC 0|1 (default 0: NCHW), also as
// kChannelsLast for the index templates of dnnctl/conv_shape.cuh. Include as
// <dnnctl/conv_layout.cuh>.
#pragma once
#include <dnnctl/conv.cuh>
#include <dnnctl/conv_shape.cuh>

#ifndef NHWC
#define NHWC 0
#endif

namespace dnnctl {

constexpr bool kChannelsLast = NHWC != 0;

}  // namespace dnnctl
