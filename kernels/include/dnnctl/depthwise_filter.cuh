// dnnctl depthwise conv2d filter geometry, compiled in by kernels/conv2d/depthwise*.cu: KR x KS
// taps, stride STR_H x STR_W, dilation DIL_H x DIL_W (-D macros; defaults: a 3 x 3 filter,
// stride and dilation 1). Include as <dnnctl/depthwise_filter.cuh>.
#pragma once

#ifndef KR
#define KR 3
#endif
#ifndef KS
#define KS 3
#endif
#ifndef STR_H
#define STR_H 1
#endif
#ifndef STR_W
#define STR_W 1
#endif
#ifndef DIL_H
#define DIL_H 1
#endif
#ifndef DIL_W
#define DIL_W 1
#endif
