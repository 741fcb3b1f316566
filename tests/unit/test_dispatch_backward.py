"""The backward functions on the run-time pipeline: a repeated call reuses its Site.

Every public backward function goes through ``dispatch.call`` like the forward ones. These
tests check, on the numpy backend and with torch CPU tensors, that the second call with one
signature takes the cached Site (no parse, no new site), gives the first call's numbers, and
that those match torch.autograd (float64); that statistics an op function recomputes are
recomputed on every call (not cached with the Site); that bad input is still refused after
a good call of the same shape; and that a non-deterministic plan entry is passed over in
deterministic mode on the cached path too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

import dnnctl
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import dispatch, registry
from dnnctl.ops.base import Choice, Problem
from dnnctl.ops.passes import NumpyVariant

torch = pytest.importorskip("torch")
F = torch.nn.functional
ops = dnnctl.ops
RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


XR, GR, WR = rand(4, 3, 24), rand(4, 3, 24), rand(24)  # rows: (12, 24) problems
X4, G4, C6 = rand(2, 6, 5, 5), rand(2, 6, 5, 5), rand(6)  # NCHW
GP = rand(2, 6, 2, 2)  # 2x2 pooling of X4
WC, GC = rand(4, 6, 3, 3), rand(2, 4, 5, 5)  # conv, padding 1
Y4 = np.exp(X4) / np.exp(X4).sum(axis=1, keepdims=True)  # softmax over axis 1
MEAN4 = X4.mean(axis=(0, 2, 3))
INV4 = (1.0 / np.sqrt(X4.var(axis=(0, 2, 3)) + 1e-5)).astype(np.float32)
Z24, Z6, Z4 = (np.zeros(n, np.float32) for n in (24, 6, 4))


def _autograd(fn: Callable[..., Any], dy: np.ndarray, *leaves: np.ndarray) -> list[np.ndarray]:
    """d(sum(fn(*leaves) * dy)) / d(leaves), in float64."""
    ts = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in leaves]
    fn(*ts).backward(torch.tensor(dy, dtype=torch.float64))
    return [t.grad.numpy() for t in ts]


def _bias4(x: Any, b: Any) -> Any:
    return x + b[None, :, None, None]


# name: (call given an array maker t, torch reference as a list of gradients)
CASES: dict[str, tuple[Callable[[Callable], Any], Callable[[], list[np.ndarray]]]] = {
    "layer_norm, statistics recomputed": (
        lambda t: ops.layer_norm_backward(t(GR), t(XR), t(WR)),
        lambda: _autograd(lambda x, w, b: F.layer_norm(x, (24,), w, b), GR, XR, WR, Z24)),
    "rms_norm, no weight": (
        lambda t: ops.rms_norm_backward(t(GR), t(XR)),
        lambda: [*_autograd(lambda x: F.rms_norm(x, (24,), eps=1e-6), GR, XR), None]),
    "softmax over axis 1 (prepare / finish)": (
        lambda t: ops.softmax_backward(t(Y4), t(G4), axis=1),
        lambda: _autograd(lambda x: torch.softmax(x, 1), G4, X4)),
    "batch_norm": (
        lambda t: ops.batch_norm_backward(t(G4), t(X4), t(MEAN4), t(INV4), t(C6)),
        lambda: _autograd(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                          G4, X4, C6, Z6)),
    "group_norm, statistics recomputed": (
        lambda t: ops.group_norm_backward(t(G4), t(X4), 3, t(C6)),
        lambda: _autograd(lambda x, w, b: F.group_norm(x, 3, w, b), G4, X4, C6, Z6)),
    "relu with a channel bias": (
        lambda t: ops.relu_backward(t(G4), t(X4), t(C6)),
        lambda: _autograd(lambda x, b: torch.relu(_bias4(x, b)), G4, X4, C6)),
    "avg_pool2d": (
        lambda t: ops.avg_pool2d_backward(t(GP), X4.shape, 2),
        lambda: _autograd(lambda x: F.avg_pool2d(x, 2), GP, X4)),
    "global_avg_pool2d": (
        lambda t: ops.global_avg_pool2d_backward(t(GP[:, :, :1, :1].copy()), X4.shape),
        lambda: _autograd(lambda x: x.mean(dim=(2, 3), keepdim=True),
                          GP[:, :, :1, :1].copy(), X4)),
    "conv2d dgrad": (
        lambda t: ops.conv2d_backward_data(t(GC), t(WC), X4.shape, padding=1),
        lambda: _autograd(lambda x: F.conv2d(x, torch.tensor(WC, dtype=torch.float64),
                                             padding=1), GC, X4)),
    "conv2d wgrad": (
        lambda t: ops.conv2d_backward_weight(t(X4), t(GC), WC.shape, padding=1),
        lambda: _autograd(lambda w, b: F.conv2d(torch.tensor(X4, dtype=torch.float64), w, b,
                                                padding=1), GC, WC, Z4)),
}

KINDS: dict[str, tuple[Callable[[np.ndarray], Any], Callable[[Any], np.ndarray], type]] = {
    "numpy": (lambda a: a, lambda a: a, np.ndarray),
    "torch": (torch.from_numpy, lambda t: t.numpy(), torch.Tensor),
}


def _grads(result: Any) -> list[Any]:
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(CASES))
def test_repeated_backward_call_reuses_its_site(name: str, kind: str, monkeypatch) -> None:
    call, reference = CASES[name]
    to, back, cls = KINDS[kind]
    dispatch._SITES.clear()
    first = _grads(call(to))
    assert len(dispatch._SITES) == 1, "the validated signature was not remembered"
    site = next(iter(dispatch._SITES.values()))

    def no_parse(*args: Any) -> Any:
        raise AssertionError("a repeated call parsed its arguments again")

    monkeypatch.setattr(dispatch, "_new_site", no_parse)
    for _ in range(2):
        again = _grads(call(to))
        assert len(dispatch._SITES) == 1 and next(iter(dispatch._SITES.values())) is site
        assert len(again) == len(first)
        for a, b in zip(again, first):
            assert (a is None) == (b is None)
            if a is not None:
                assert type(a) is cls and a is not b
                np.testing.assert_array_equal(back(a), back(b))
    want = reference()
    assert len(first) == len(want), name
    for got, exp in zip(first, want):
        if exp is None:
            assert got is None
        else:
            assert back(got).shape == exp.shape
            np.testing.assert_allclose(back(got), exp, rtol=1e-4, atol=1e-4, err_msg=name)


def test_numpy_and_torch_calls_give_the_same_numbers() -> None:
    for name, (call, _) in CASES.items():
        a, b = _grads(call(lambda v: v)), _grads(call(torch.from_numpy))
        for x, y in zip(a, b):
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_array_equal(x, y.numpy(), err_msg=name)


def test_max_pool_with_indices_and_its_backward_reuse_their_sites() -> None:
    dispatch._SITES.clear()
    for _ in range(2):
        y, idx = ops.max_pool2d_with_indices(X4, 2)
        dx = ops.max_pool2d_backward(GP, idx, X4.shape, 2)
    assert len(dispatch._SITES) == 2
    t = torch.tensor(X4, requires_grad=True)
    ty, tidx = F.max_pool2d(t, 2, return_indices=True)
    ty.backward(torch.from_numpy(GP))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(idx, tidx.numpy())
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-6)


def test_statistics_are_recomputed_on_every_call() -> None:
    """The layer_norm / group_norm statistics the caller omits come from this call's x (a
    prepare hook), never from the call that made the Site."""
    x, x2 = XR.copy(), (XR * 3 + 1).astype(np.float32)
    first = ops.layer_norm_backward(GR, x, WR)[0]
    x[...] = x2  # same signature, new values
    again = ops.layer_norm_backward(GR, x, WR)[0]
    _, mean, rstd = ops.layer_norm_with_stats(x2, WR)
    np.testing.assert_array_equal(again, ops.layer_norm_backward(GR, x2, WR, mean, rstd)[0])
    assert np.abs(again - first).max() > 1e-3
    g = X4.copy()
    before = ops.group_norm_backward(G4, g, 3)[0]
    g *= 2
    after = ops.group_norm_backward(G4, g, 3)[0]
    want = _autograd(lambda v: F.group_norm(v, 3), G4, g)[0]
    np.testing.assert_allclose(after, want, rtol=1e-4, atol=1e-4)
    assert np.abs(after - before).max() > 1e-3


def test_with_stats_forwards_reuse_their_site_and_return_fp32_statistics() -> None:
    dispatch._SITES.clear()
    for kind in ("numpy", "torch"):
        to, back, cls = KINDS[kind]
        for _ in range(2):
            y, mean, rstd = ops.layer_norm_with_stats(to(XR), to(WR))
            yr, rr = ops.rms_norm_with_stats(to(XR))
        assert all(type(v) is cls for v in (y, mean, rstd, yr, rr))
        np.testing.assert_array_equal(back(y), ops.layer_norm(XR, WR))
        np.testing.assert_array_equal(back(yr), ops.rms_norm(XR))
        rows = XR.reshape(12, 24).astype(np.float64)
        np.testing.assert_allclose(back(mean), rows.mean(-1), rtol=1e-5, atol=1e-6)
        assert back(mean).dtype == np.float32 and back(rstd).shape == (12,)
        np.testing.assert_allclose(back(rr), 1 / np.sqrt((rows ** 2).mean(-1) + 1e-6),
                                   rtol=1e-5)
    assert len(dispatch._SITES) == 2 * 2 + 2  # two signatures per kind; the plain forwards


def test_bad_input_is_refused_after_a_good_call_of_the_same_shape() -> None:
    ops.layer_norm_backward(GR, XR, WR)
    with pytest.raises(ShapeError, match="dy has dtype float16"):
        ops.layer_norm_backward(GR.astype(np.float16), XR, WR)
    with pytest.raises(ShapeError, match=r"mean has 5 values, expected 12"):
        ops.layer_norm_backward(GR, XR, WR, rand(5), rand(12))
    # statistics of another dtype or layout are read through an fp32 contiguous copy
    _, mean, rstd = ops.layer_norm_with_stats(XR, WR)
    want = ops.layer_norm_backward(GR, XR, WR, mean, rstd)
    got = ops.layer_norm_backward(GR, XR, WR, mean.astype(np.float64),
                                  np.repeat(rstd, 2)[::2])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    ops.batch_norm_backward(G4, X4, MEAN4, INV4)
    with pytest.raises(ShapeError, match="save_mean is required"):
        ops.batch_norm_backward(G4, X4, None, INV4)
    with pytest.raises(ShapeError, match="save_invstd has dtype float64"):
        ops.batch_norm_backward(G4, X4, MEAN4, INV4.astype(np.float64))
    with pytest.raises(ShapeError, match=r"channels are not divisible into 4 groups"):
        ops.group_norm_backward(G4, X4, 4)
    with pytest.raises(UsageError, match="unknown activation 'swish'"):
        ops.activation_backward("swish", G4, X4)
    with pytest.raises(ShapeError, match="out of range for rank 4"):
        ops.softmax_backward(Y4, G4, axis=4)
    ops.conv2d_backward_data(GC, WC, X4.shape, padding=1)
    with pytest.raises(ShapeError, match="mix dtypes"):
        ops.conv2d_backward_data(GC, WC.astype(np.float16), X4.shape, padding=1)
    with pytest.raises(ShapeError, match=r"dy has shape \(2, 4, 5, 5\), expected \(2, 4, 3, 3\)"):
        ops.conv2d_backward_data(GC, WC, X4.shape)
    with pytest.raises(UsageError, match="x_shape=3 must be 4 positive ints"):
        ops.conv2d_backward_data(GC, WC, 3, padding=1)
    with pytest.raises(ShapeError, match="input_shape 5 is not a shape"):
        ops.avg_pool2d_backward(GP, 5, 2)


def test_strided_conv_gradient_inputs_are_copied_on_every_call() -> None:
    big = rand(2, 4, 5, 10)
    dy = big[..., ::2]  # (2, 4, 5, 5), not contiguous
    dispatch._SITES.clear()
    for step in range(2):
        big[:] = rand(2, 4, 5, 10)  # new values: a remembered copy would be stale
        got = ops.conv2d_backward_data(dy, WC, X4.shape, padding=1)
        want = ops.conv2d_backward_data(np.ascontiguousarray(dy), WC, X4.shape, padding=1)
        np.testing.assert_array_equal(got, want, err_msg=str(step))
    assert any(site.prepare is not None for site in dispatch._SITES.values())


# ----------------------------------------------------------------------------- determinism


class _OnePlan:
    def __init__(self, choice: Choice) -> None:
        self.choice = choice

    def lookup(self, problem: Problem, backend: str, device: Any) -> Choice | None:
        return self.choice if problem.op == "softmax" and problem["pass"] == "backward" \
            else None


class NondetSoftmaxBackward(NumpyVariant):
    op = "softmax"
    name = "test_nondet_bwd"
    passes = ("backward",)
    doc = "test-only: counts its calls; flagged non-deterministic"
    deterministic = False
    calls = 0

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        type(self).calls += 1
        y, dy = (np.asarray(inputs[k], np.float64) for k in ("y", "dy"))
        return {"dx": y * (dy - (y * dy).sum(-1, keepdims=True))}


@pytest.fixture
def nondet() -> Iterator[type]:
    NondetSoftmaxBackward.calls = 0
    registry.register_variant(NondetSoftmaxBackward)
    try:
        yield NondetSoftmaxBackward
    finally:
        registry._VARIANTS[("softmax", "numpy")].pop("test_nondet_bwd")


def test_deterministic_mode_passes_over_a_non_deterministic_backward_entry(nondet) -> None:
    y = np.exp(XR) / np.exp(XR).sum(-1, keepdims=True)
    plan = _OnePlan(Choice.of("test_nondet_bwd"))
    free = ops.softmax_backward(y, GR, plan=plan)
    assert nondet.calls == 1
    with dnnctl.use_deterministic():
        for _ in range(2):  # the second call takes the site's cached path
            det = ops.softmax_backward(y, GR, plan=plan)
    assert nondet.calls == 1, "a non-deterministic plan entry ran inside use_deterministic"
    torch.use_deterministic_algorithms(True)
    try:
        ops.softmax_backward(torch.from_numpy(y), torch.from_numpy(GR), plan=plan)
    finally:
        torch.use_deterministic_algorithms(False)
    assert nondet.calls == 1, "torch asked for deterministic algorithms"
    ops.softmax_backward(y, GR, plan=plan)  # outside the block the entry runs again
    assert nondet.calls == 2
    np.testing.assert_allclose(det, free, rtol=1e-5, atol=1e-6)
