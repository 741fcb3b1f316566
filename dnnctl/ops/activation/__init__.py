"""activation: the op (relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh, relu6,
hardswish, hardsigmoid with an optional fused per-channel bias), its numpy and CUDA variants for the forward and backward
passes, and the public functions.

Importing this package registers the op and every variant.
"""

from __future__ import annotations

# variants register on import (the order of registration is the tuner's order of preference)
from dnnctl.ops.activation import (  # noqa: F401
    cuda_backward,
    cuda_variants,
    numpy_variants,
)
from dnnctl.ops.activation.backward_function import (
    activation_backward,
    gelu_backward,
    gelu_tanh_backward,
    hardsigmoid_backward,
    hardswish_backward,
    leaky_relu_backward,
    relu6_backward,
    relu_backward,
    sigmoid_backward,
    silu_backward,
    tanh_backward,
)
from dnnctl.ops.activation.function import (
    gelu,
    hardsigmoid,
    hardswish,
    leaky_relu,
    relu,
    relu6,
    sigmoid,
    silu,
    tanh,
)
from dnnctl.ops.activation.op import ACT_CODE, ActivationOp, geometry
from dnnctl.ops.activation.reference import FNS, act_grad_numpy, act_numpy

__all__ = ["ACT_CODE", "FNS", "ActivationOp", "act_grad_numpy", "act_numpy",
           "activation_backward", "gelu", "gelu_backward", "gelu_tanh_backward", "geometry",
           "hardsigmoid", "hardsigmoid_backward", "hardswish", "hardswish_backward",
           "leaky_relu", "leaky_relu_backward", "relu", "relu6", "relu6_backward",
           "relu_backward", "sigmoid", "sigmoid_backward", "silu", "silu_backward", "tanh",
           "tanh_backward"]
