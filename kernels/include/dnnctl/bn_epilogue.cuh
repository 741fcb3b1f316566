// batch_norm's fused epilogue, one set of defaults for every kernel that takes it (forward
// and backward): BN_ACT (1: relu(y), the fused ReLU; NaN stays NaN, as torch.relu) and
// BN_RESID (1: y = act(bn(x) + z), z of x's shape, a ResNet block's end; the kernel's z
// argument, null otherwise).
#pragma once

#ifndef BN_ACT
#define BN_ACT 0
#endif
#ifndef BN_RESID
#define BN_RESID 0
#endif
