"""Verification of gradients whose terms cancel: the error of a result that is (near) zero is
measured against the magnitude of the terms it is the sum of (Op.error_scale), not against
the zero. Cases from the H200: a layer_norm row of length 1 (dx = 0 exactly) and batch_norm
with two elements per channel (xhat = +-1, dx ~ 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import error_norm, rel_norm_error, verify_outputs
from dnnctl.ops.check import prepare
from dnnctl.ops.registry import get_op

BW = {"pass": "backward"}
f32 = np.float32


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add (the product exact in float64, one rounding)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(f32)


def test_scale_is_the_denominator_where_it_exceeds_the_reference() -> None:
    ref = np.zeros(4)
    scale = np.full(4, 100.0)
    assert rel_norm_error(np.full(4, 1e-6), ref) == math.inf  # the old 0-reference answer
    assert rel_norm_error(np.full(4, 1e-6), ref, scale) == pytest.approx(1e-8)
    assert rel_norm_error(np.full(4, 50.0), ref, scale) == pytest.approx(0.5)
    assert rel_norm_error(np.zeros(4), ref, np.zeros(4)) == 0.0
    # where |ref| > scale the reference is the denominator, as before
    ref2 = np.array([3.0, 4.0])
    assert rel_norm_error(ref2 + 0.5, ref2, np.zeros(2)) == rel_norm_error(ref2 + 0.5, ref2)
    assert error_norm(ref2, np.array([0.0, 12.0])) == pytest.approx(math.hypot(3, 12))
    # non-finite reference positions are still matched exactly and left out
    ref3 = np.array([np.nan, 0.0])
    assert rel_norm_error(np.array([np.nan, 1e-3]), ref3, np.array([1.0, 1.0])) == \
        pytest.approx(1e-3)
    assert rel_norm_error(np.array([0.0, 0.0]), ref3, np.ones(2)) == math.inf


def _layer_norm_cols1() -> tuple:
    op = get_op("layer_norm")
    problem = op.problem(dict(rows=9, cols=1, dtype="float32", **BW))
    prep = prepare(op, problem, get_backend("numpy"), np.random.default_rng(5))
    return op, problem, prep


def test_layer_norm_row_of_length_one_is_checked_against_its_terms() -> None:
    op, problem, prep = _layer_norm_cols1()
    h = prep.host_inputs
    assert np.all(prep.refs["dx"] == 0.0)
    # what the fused kernel wrote on the H200: rstd (fma(dy, w, -round(dy w))), the product's
    # rounding error (~1e-6 with rstd = 1 / sqrt(eps))
    g = (h["dy"] * h["weight"]).astype(f32)
    resid = _fma32(h["dy"], h["weight"][None, :], -g)
    fused = (h["rstd"][:, None] * resid).astype(f32)
    assert np.any(fused != 0) and np.abs(fused).max() < 1e-3
    got = {"dx": fused, "dweight": prep.refs["dweight"], "dbias": prep.refs["dbias"]}
    assert verify_outputs(op, problem, got, prep.refs).errors["dx"] == math.inf
    res = verify_outputs(op, problem, got, prep.refs, prep.scales)
    assert res.ok and res.errors["dx"] < 1e-6, res.detail
    # a wrong kernel (the mean term dropped: dx = rstd g) is still caught
    bad = dict(got, dx=(h["rstd"][:, None] * g).astype(f32))
    res = verify_outputs(op, problem, bad, prep.refs, prep.scales)
    assert not res.ok and res.errors["dx"] > 0.3


def _bn_kernel_dx(h: dict, folded: bool) -> np.ndarray:
    """bn_bwd_reduce_rows + bn_bwd_dx of kernels/norm/bn_backward.cu in float32 with FMAs
    (NHWC, no affine): dx = a dy + b (x - mean) + c0, or the folded a dy + b x + c0' the
    kernel computed on the H200 run (c0' = c0 - b mean)."""
    dy, x = h["dy"].reshape(-1, h["dy"].shape[-1]), h["x"].reshape(-1, h["x"].shape[-1])
    m, iv = h["save_mean"], h["save_invstd"]
    count = f32(dy.shape[0])
    s1 = dy.sum(axis=0, dtype=f32)
    s2 = np.zeros_like(s1)
    for r in range(dy.shape[0]):
        s2 = _fma32(dy[r], (x[r] - m).astype(f32), s2)
    a = iv
    b = ((-a * iv * iv * s2).astype(f32) / count).astype(f32)
    if folded:
        c0 = _fma32(-a, (s1 / count).astype(f32), (-b * m).astype(f32))
        return _fma32(a, dy, _fma32(b, x, c0)).reshape(h["dx_shape"])
    c0 = (-a * (s1 / count)).astype(f32)
    return _fma32(a, dy, _fma32(b, (x - m).astype(f32), c0)).reshape(h["dx_shape"])


@pytest.mark.parametrize("seed", [10, 11, 12])
def test_batch_norm_two_elements_per_channel(seed: int) -> None:
    """The H200's 2.2e-4 "relative" error was float32 rounding of terms ~6000x the result
    (seed 10 is the GPU test's problem): relative to the terms it is ~2e-8."""
    op = get_op("batch_norm")
    problem = op.problem(dict(n=2, c=5, h=1, w=1, dtype="float32", layout="NHWC",
                              training=True, affine=False, **BW))
    prep = prepare(op, problem, get_backend("numpy"), np.random.default_rng(seed))
    h = dict(prep.host_inputs, dx_shape=prep.refs["dx"].shape)
    ref, scale = prep.refs["dx"], prep.scales["dx"]
    assert error_norm(ref, scale) > 100 * np.linalg.norm(ref)  # the terms cancel
    tol = op.tolerance(problem, "dx")
    for folded in (True, False):
        got = _bn_kernel_dx(h, folded)
        err = verify_outputs(op, problem, {"dx": got}, prep.refs, prep.scales).errors["dx"]
        assert err < 1e-6 < tol  # float32 rounding of the terms, nothing more
    wrong = (h["save_invstd"] * (h["dy"] - h["dy"].mean(axis=0))).astype(f32)  # no xhat term
    assert not verify_outputs(op, problem, {"dx": wrong}, prep.refs, prep.scales).ok


@pytest.mark.parametrize("op_name,key", [
    ("softmax", dict(rows=4, cols=1, dtype="float32")),
    ("softmax", dict(rows=4, cols=1, dtype="float32", log=True)),
    ("softmax", dict(rows=3, cols=50, dtype="float16")),
    ("layer_norm", dict(rows=5, cols=40, dtype="bfloat16")),
    ("rms_norm", dict(rows=2, cols=1, dtype="float32")),
    ("batch_norm", dict(n=3, c=4, h=2, w=3, dtype="float16", layout="NCHW", training=True)),
    ("group_norm", dict(n=2, c=6, h=1, w=1, groups=3, dtype="float32", layout="NHWC")),
])
def test_backward_scales_bound_the_reference_and_the_numpy_variant_passes(
        op_name: str, key: dict) -> None:
    from dnnctl.ops.check import run_and_verify
    from dnnctl.ops.registry import get_variant

    op = get_op(op_name)
    problem = op.problem(dict(key, **BW))
    be = get_backend("numpy")
    prep = prepare(op, problem, be, np.random.default_rng(0))
    assert set(prep.scales) == {"dx"}
    # the terms' magnitudes bound the sum: |dx| <= scale (up to float64 rounding)
    assert np.all(np.abs(prep.refs["dx"]) <= prep.scales["dx"] * (1 + 1e-12) + 1e-300)
    kern = get_variant(op_name, "numpy", "bwd_numpy").build(problem, {}, be.device(0))
    res = run_and_verify(op, problem, kern, be, np.random.default_rng(1))
    assert res.ok, res.detail


def test_forward_problems_have_no_scale() -> None:
    op = get_op("layer_norm")
    problem = op.problem(dict(rows=3, cols=8, dtype="float32"))
    prep = prepare(op, problem, get_backend("numpy"), np.random.default_rng(0))
    assert prep.scales == {}


def test_tune_worker_device_metric_uses_the_same_denominator() -> None:
    from dnnctl.tune.worker import rel_err_xp

    ref = np.zeros(6)
    scale = np.full(6, 7.0)
    out = np.full(6, 1e-5)
    assert rel_err_xp(np, out, ref, error_norm(ref, scale)) == pytest.approx(
        rel_norm_error(out, ref, scale))
    assert rel_err_xp(np, out, ref) == math.inf


def test_unfolded_dx_keeps_the_bits_of_an_offset_channel() -> None:
    """Why bn_bwd_dx / gn_bwd_dx subtract the mean per element: with mean = 1e4 std, the
    folded b x + (c0 - b mean) cancels b x against b mean and loses ~13 bits."""
    rng = np.random.default_rng(0)
    m_rows = 64
    x = (rng.standard_normal((m_rows, 1)) + 1e4).astype(f32)
    dy = rng.standard_normal((m_rows, 1)).astype(f32)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=0)
    invstd = 1 / np.sqrt(((xd - mean) ** 2).mean(axis=0) + 1e-5)
    h = {"dy": dy, "x": x, "save_mean": mean.astype(f32), "save_invstd": invstd.astype(f32),
         "dx_shape": x.shape}
    xh = (xd - h["save_mean"]) * h["save_invstd"]
    g = dy.astype(np.float64)
    ref = h["save_invstd"] * (g - g.mean(axis=0) - xh * (g * xh).mean(axis=0))
    folded = rel_norm_error(_bn_kernel_dx(h, True), ref)
    unfolded = rel_norm_error(_bn_kernel_dx(h, False), ref)
    assert unfolded < 2e-7 and folded > 20 * unfolded
