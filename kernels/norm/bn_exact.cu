// batch_norm inference as an exact-grid vector stream: the kernel bn_exact of
// <dnnctl/bn_exact.cuh> (compile with PARAMS=0: scale = weight * rsqrt(running_var + eps)).
// Defines: DNNCTL_DTYPE, AFFINE, PARAMS, LAYOUT, CH, HW.
#include <dnnctl/bn_exact.cuh>
