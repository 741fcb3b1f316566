"""activation, softmax and the normalizations are op packages of the conv2d / matmul shape;
public names stay."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import dnnctl.ops as ops
from dnnctl.ops import registry

SHAPE = ("op", "function", "backward", "backward_function", "numpy_variants", "cuda_variants",
         "cuda_backward")


# package -> the registry ops it defines (layer_norm and rms_norm share one key schema)
PACKAGES = {"activation": ("activation",), "softmax": ("softmax",),
            "rownorm": ("layer_norm", "rms_norm"), "batch_norm": ("batch_norm",),
            "group_norm": ("group_norm",)}


@pytest.mark.parametrize("pkg_name", sorted(PACKAGES))
def test_op_is_a_package_of_the_common_shape(pkg_name):
    pkg = importlib.import_module(f"dnnctl.ops.{pkg_name}")
    assert hasattr(pkg, "__path__")
    assert f"dnnctl.ops.{pkg_name}" in registry.OP_MODULES
    for part in SHAPE:
        importlib.import_module(f"dnnctl.ops.{pkg_name}.{part}")
    for op in PACKAGES[pkg_name]:
        spec = registry.get_op(op)
        assert type(spec).__module__ == f"dnnctl.ops.{pkg_name}.op"
        backends = {(v.backend, v.name): v for v in registry.variants(op)}
        assert {b for b, _ in backends} == {"cupy", "numpy"}
        for v in backends.values():
            assert type(v).__module__.startswith(f"dnnctl.ops.{pkg_name}."), (op, v.name)
        # every op has a backward pass, registered before the forward variants
        names = [v.name for v in registry.variants(op, "numpy")]
        assert names[0] == "bwd_numpy", names


def test_the_old_norm_module_is_gone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dnnctl.ops.norm")


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



def test_norm_public_names_resolve_to_their_packages():
    rng = np.random.default_rng(0)
    for name, pkg in (("layer_norm", "rownorm"), ("rms_norm", "rownorm"),
                      ("layer_norm_backward", "rownorm"), ("rms_norm_backward", "rownorm"),
                      ("layer_norm_with_stats", "rownorm"), ("rms_norm_with_stats", "rownorm"),
                      ("batch_norm_backward", "batch_norm"),
                      ("group_norm_backward", "group_norm")):
        assert getattr(ops, name).__module__.startswith(f"dnnctl.ops.{pkg}."), name
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = ops.layer_norm(x)
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=1), 1.0, rtol=1e-3)
    x4 = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    import dnnctl.ops.batch_norm as bn_pkg
    import dnnctl.ops.group_norm as gn_pkg

    yb = ops.batch_norm(x4, training=True)  # batch statistics: per channel mean 0
    np.testing.assert_allclose(yb.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    # the package names both a submodule and the public function: it is callable as it
    assert ops.batch_norm is bn_pkg and ops.group_norm is gn_pkg
    np.testing.assert_array_equal(bn_pkg(x4, training=True), yb)
    yg = ops.group_norm(x4, 2)
    np.testing.assert_allclose(yg.reshape(2, 2, -1).mean(axis=2), 0.0, atol=1e-5)
    np.testing.assert_array_equal(gn_pkg(x4, 2), yg)
