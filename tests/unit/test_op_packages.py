"""activation and softmax are op packages of the conv2d / matmul shape; public names stay."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import dnnctl.ops as ops
from dnnctl.ops import registry

SHAPE = ("op", "function", "backward", "backward_function", "numpy_variants", "cuda_variants",
         "cuda_backward")


@pytest.mark.parametrize("op", ["activation", "softmax"])
def test_op_is_a_package_of_the_common_shape(op):
    pkg = importlib.import_module(f"dnnctl.ops.{op}")
    assert hasattr(pkg, "__path__")
    for part in SHAPE:
        importlib.import_module(f"dnnctl.ops.{op}.{part}")
    spec = registry.get_op(op)
    assert type(spec).__module__ == f"dnnctl.ops.{op}.op"
    backends = {(v.backend, v.name): v for v in registry.variants(op)}
    assert {b for b, _ in backends} == {"cupy", "numpy"}
    for v in backends.values():
        assert type(v).__module__.startswith(f"dnnctl.ops.{op}.")


def test_public_names_resolve_to_the_package_functions():
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    for name in ("relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "activation_backward",
                 "relu_backward", "gelu_tanh_backward", "leaky_relu_backward"):
        assert getattr(ops, name).__module__.startswith("dnnctl.ops.activation."), name
    for name in ("softmax_backward", "log_softmax_backward", "log_softmax"):
        assert getattr(ops, name).__module__.startswith("dnnctl.ops.softmax."), name
    np.testing.assert_allclose(ops.relu(x), np.maximum(x, 0))
    np.testing.assert_allclose(ops.relu_backward(np.ones_like(x), x), (x > 0).astype(np.float32))
    y = ops.softmax(x)  # the package is callable as the function
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    import dnnctl.ops.softmax as softmax_pkg

    np.testing.assert_array_equal(softmax_pkg(x), y)
    dx = ops.softmax_backward(y, np.ones_like(x))  # d(sum softmax)/dx = 0
    np.testing.assert_allclose(dx, 0.0, atol=1e-6)

