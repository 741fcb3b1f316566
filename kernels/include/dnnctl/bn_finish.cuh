// batch_norm training: what a statistics kernel writes once a channel's sums are complete
// (kernels/norm/bn_onepass.cu, bn_persist.cu): save_mean, save_invstd, the running statistics
// (momentum, unbiased variance; the running arrays may alias the new ones: each is read
// before it is written, by the same thread) and scale = weight * invstd.
#pragma once
#include <dnnctl/memory.cuh>

// What both statistics kernels write, in the order the host passes it after the shape: the
// running statistics (read, then written: the arrays may alias), save_mean, save_invstd, and
// scale = weight * invstd; eps and momentum.
#define BNT_OUT_PARAMS                                                                      \
  const float* running_mean, const float* running_var, float* new_running_mean,            \
      float* new_running_var, float* __restrict__ save_mean, float* __restrict__ save_invstd, \
      const float* __restrict__ w, float* __restrict__ scale, float eps, float momentum
#define BNT_OUT_ARGS                                                                     \
  running_mean, running_var, new_running_mean, new_running_var, save_mean, save_invstd, w, \
      scale, eps, momentum

// The statistics of channel c from the sums of (x - k) over `count` values.
__device__ __forceinline__ void bnt_finish(int c, float k, float s1, float s2, float count,
                                           BNT_OUT_PARAMS) {
  const float d = s1 / count;
  const float mean = k + d;
  const float var = fmaxf(s2 / count - d * d, 0.f);
  const float invstd = rsqrtf(var + eps);
  save_mean[c] = mean;
  save_invstd[c] = invstd;
  const float rm = running_mean[c], rv = running_var[c];
  new_running_mean[c] = (1.f - momentum) * rm + momentum * mean;
  new_running_var[c] = (1.f - momentum) * rv + momentum * (var * count / (count - 1.f));
  scale[c] = AFFINE ? invstd * w[c] : invstd;
}
