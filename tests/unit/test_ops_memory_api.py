"""The public dnnctl.ops functions of the memory-bound ops on NumPy arrays: results against
the references, out= / in-place, layouts, plans, and the errors that say what was expected."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import dnnctl.ops as ops
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import Choice, Problem
from dnnctl.ops.dispatch import use_plan

RNG = np.random.default_rng(7)


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def test_activations_compute_the_functions() -> None:
    x = rand(4, 3, 5) * 3
    bias = rand(3)
    np.testing.assert_array_equal(ops.relu(x), np.maximum(x, 0))
    xb = x + bias[None, :, None]
    np.testing.assert_allclose(ops.silu(x, bias=bias), xb / (1 + np.exp(-xb)), rtol=1e-6)
    np.testing.assert_allclose(ops.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(ops.tanh(x), np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(ops.leaky_relu(x, 0.2), np.where(x > 0, x, 0.2 * x), rtol=1e-7)
    g = ops.gelu(x)
    g_tanh = ops.gelu(x, approximate="tanh")
    assert np.abs(g - g_tanh).max() < 5e-3 and np.abs(g - g_tanh).max() > 0
    nhwc = rand(2, 4, 4, 3)
    np.testing.assert_allclose(ops.relu(nhwc, bias=bias, layout="NHWC"),
                               np.maximum(nhwc + bias, 0), rtol=1e-7)


def test_activation_out_and_inplace_write_the_callers_array() -> None:
    x = rand(6, 7)
    want = np.maximum(x, 0)
    out = np.empty_like(x)
    assert ops.relu(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    y = ops.relu(x, inplace=True)
    assert y is x
    np.testing.assert_array_equal(x, want)
    z = rand(5)
    assert ops.gelu(z, out=z) is z  # out=x is in-place


def test_activation_errors_name_what_was_expected() -> None:
    x = rand(2, 3, 4)
    with pytest.raises(ShapeError, match="dtype float64, expected one of float32"):
        ops.relu(x.astype(np.float64))
    with pytest.raises(ShapeError, match=r"bias has shape \(4,\), expected \(3,\)"):
        ops.relu(x, bias=rand(4))
    with pytest.raises(ShapeError, match="bias has dtype float16, expected float32"):
        ops.relu(x, bias=rand(3, dtype=np.float16))
    with pytest.raises(ShapeError, match="C-contiguous"):
        ops.relu(x[:, :, ::2])
    with pytest.raises(ShapeError, match=r"out has shape \(2, 3\), expected \(2, 3, 4\)"):
        ops.relu(x, out=rand(2, 3))
    with pytest.raises(ShapeError, match="inplace=True but out is not x"):
        ops.relu(x, out=np.empty_like(x), inplace=True)
    with pytest.raises(ShapeError, match="mix array kinds|expected an array"):
        ops.relu([1.0, 2.0])
    with pytest.raises(UsageError, match="approximate"):
        ops.gelu(x, approximate="fast")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_softmax_any_axis_and_dtype(dtype: Any) -> None:
    x = (rand(3, 4, 5) * 2).astype(dtype)
    xf = x.astype(np.float64)
    for axis in (-1, 0, 1):
        y = ops.softmax(x, axis=axis)
        assert y.dtype == x.dtype and y.shape == x.shape and y.flags.c_contiguous
        e = np.exp(xf - xf.max(axis=axis, keepdims=True))
        want = e / e.sum(axis=axis, keepdims=True)
        tol = 1e-6 if dtype == np.float32 else 1e-2
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)
    lsm = ops.log_softmax(x.astype(np.float32), axis=1)
    np.testing.assert_allclose(np.exp(lsm).sum(axis=1), 1.0, rtol=1e-5)
    out = np.empty((3, 4, 5), np.float32)
    assert ops.softmax(x.astype(np.float32), axis=0, out=out) is out
    np.testing.assert_allclose(out.sum(axis=0), 1.0, rtol=1e-5)
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        ops.softmax(x, axis=3)
    assert ops.softmax is not None and callable(ops.softmax)


def test_norms_match_their_definitions() -> None:
    x = rand(5, 6, 32) * 2 + 1
    w, b = rand(32), rand(32)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(ops.layer_norm(x, w, b, eps=1e-5),
                               (x - mean) / np.sqrt(var + 1e-5) * w + b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ops.rms_norm(x, w),
                               x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match=r"weight has shape \(31,\), expected \(32,\)"):
        ops.layer_norm(x, rand(31))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batch_norm_inference_and_training_update_running_stats(layout: str) -> None:
    x = rand(4, 3, 5, 6) * 2 + 0.5
    xin = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    rm, rv = rand(3) * 0.1, np.abs(rand(3)) + 0.5
    w, b = rand(3), rand(3)
    shape = (1, 3, 1, 1)
    y = ops.batch_norm(xin, rm, rv, w, b, layout=layout)
    want = (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-5) * w.reshape(
        shape) + b.reshape(shape)
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    rm0, rv0 = rm.copy(), rv.copy()
    y, smean, sinv = ops.batch_norm(xin, rm, rv, w, b, training=True, momentum=0.2,
                                    layout=layout, return_stats=True)
    bm, bv = x.mean((0, 2, 3)), x.var((0, 2, 3))
    np.testing.assert_allclose(smean, bm, rtol=1e-5)
    np.testing.assert_allclose(sinv, 1 / np.sqrt(bv + 1e-5), rtol=1e-5)
    np.testing.assert_allclose(rm, 0.8 * rm0 + 0.2 * bm, rtol=1e-5)  # updated in place
    np.testing.assert_allclose(rv, 0.8 * rv0 + 0.2 * bv * 120 / 119, rtol=1e-5)
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got.mean((0, 2, 3)), b, atol=1e-4)


def test_batch_norm_errors() -> None:
    x = rand(2, 3, 4, 4)
    with pytest.raises(ShapeError, match="inference needs running_mean and running_var"):
        ops.batch_norm(x)
    with pytest.raises(ShapeError, match="running_var has dtype float16, expected float32"):
        ops.batch_norm(x, rand(3), rand(3, dtype=np.float16))
    with pytest.raises(ShapeError, match="expected rank 2, 3 or 4"):
        ops.batch_norm(rand(2, 3, 4, 4, 1), rand(3), rand(3))
    with pytest.raises(ShapeError, match="'NCHW' or 'NHWC'"):
        ops.batch_norm(x, rand(3), rand(3), layout="CHWN")
    y = ops.batch_norm(rand(8, 3), training=True)  # (N, C), no running stats kept
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-5)


def test_group_norm_matches_definition_in_both_layouts() -> None:
    x = rand(2, 6, 3, 4) + 2
    w, b = rand(6), rand(6)
    g = x.reshape(2, 3, 2, 3, 4)
    want = ((g - g.mean((2, 3, 4), keepdims=True)) / np.sqrt(g.var((2, 3, 4), keepdims=True)
                                                           + 1e-5)).reshape(x.shape)
    want = want * w.reshape(1, 6, 1, 1) + b.reshape(1, 6, 1, 1)
    np.testing.assert_allclose(ops.group_norm(x, 3, w, b), want, rtol=1e-4, atol=1e-5)
    nhwc = ops.group_norm(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), 3, w, b,
                          layout="NHWC")
    np.testing.assert_allclose(nhwc.transpose(0, 3, 1, 2), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match="not divisible into 4 groups"):
        ops.group_norm(x, 4)


def test_pooling_shapes_values_and_layouts() -> None:
    x = rand(2, 3, 7, 8)
    y = ops.max_pool2d(x, 3, 2, 1)
    assert y.shape == (2, 3, 4, 4)
    assert y[0, 0, 0, 0] == x[0, 0, :2, :2].max()
    yc = ops.max_pool2d(x, 3, 2, 1, ceil_mode=True)
    assert yc.shape == (2, 3, 4, 5)  # W: ceil(7 / 2) + 1; the last window starts at 7 < 8
    a = ops.avg_pool2d(x, 2)
    np.testing.assert_allclose(a, x[:, :, :6, :].reshape(2, 3, 3, 2, 4, 2).mean((3, 5)),
                               rtol=1e-6, atol=1e-6)
    a2 = ops.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
    np.testing.assert_allclose(a2[0, 0, 0, 0], x[0, 0, :2, :2].mean(), rtol=1e-6)
    nhwc = ops.max_pool2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), 3, 2, 1,
                          layout="NHWC")
    np.testing.assert_array_equal(nhwc.transpose(0, 3, 1, 2), y)
    g = ops.global_avg_pool2d(x)
    assert g.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(g[..., 0, 0], x.mean((2, 3)), rtol=1e-6)
    gh = ops.global_avg_pool2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), layout="NHWC")
    assert gh.shape == (2, 1, 1, 3)
    with pytest.raises(UsageError, match="more than half the kernel"):
        ops.max_pool2d(x, 2, padding=2)
    with pytest.raises(ShapeError, match="4-D NCHW tensor"):
        ops.max_pool2d(rand(3, 7, 8), 2)
    with pytest.raises(ShapeError, match=r"out has shape \(2, 3, 3, 3\), expected"):
        ops.max_pool2d(x, 3, 2, 1, out=rand(2, 3, 3, 3))


class _Plan:
    """A minimal plan: one planned choice for one problem."""

    def __init__(self, problem: Problem, choice: Choice) -> None:
        self.problem, self.choice, self.hits = problem, choice, 0

    def lookup(self, problem: Problem, backend: str, device: Any) -> Choice | None:
        if problem == self.problem and backend == "numpy":
            self.hits += 1
            return self.choice
        return None


def test_a_plan_routes_the_call_to_its_variant() -> None:
    from dnnctl.ops.registry import get_op

    op = get_op("softmax")
    problem = op.problem(rows=6, cols=9, dtype="float32", log=False)
    plan = _Plan(problem, Choice.of("numpy_whole"))
    x = rand(2, 3, 9)
    with use_plan(plan):
        y = ops.softmax(x)
    assert plan.hits == 1
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-6)
    ops.softmax(x, plan=plan)
    assert plan.hits == 2
