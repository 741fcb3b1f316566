"""The public backward functions on the CPU against torch.autograd (float64 torch, fp32
dnnctl), and torch tensors in, torch tensors out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _np(t: Any) -> np.ndarray:
    return t.detach().numpy().astype(np.float32)


def _torch_grads(fn: Callable[..., Any], *tensors: Any) -> tuple[Any, list[Any]]:
    ts = [torch.tensor(t, dtype=torch.float64, requires_grad=True) for t in tensors]
    y = fn(*ts)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y.backward(dy)
    return dy, [t.grad.numpy() for t in ts]


def test_public_backward_functions_match_torch_autograd() -> None:
    import dnnctl.ops as o

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 5, 5)).astype(np.float32)
    w = (rng.standard_normal(6) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    close = dict(rtol=2e-4, atol=2e-5)

    x2 = x.reshape(24, 25)
    dy, (gx,) = _torch_grads(lambda t: torch.log_softmax(t, -1), x2)
    y = o.log_softmax(x2)
    np.testing.assert_allclose(o.log_softmax_backward(y, _np(dy)), gx, **close)
    dy, (gx,) = _torch_grads(lambda t: torch.softmax(t, 0), x2)
    np.testing.assert_allclose(o.softmax_backward(o.softmax(x2, axis=0), _np(dy), axis=0), gx,
                               **close)

    w25, b25 = rng.standard_normal((2, 25)).astype(np.float32)
    dy, grads = _torch_grads(lambda t, a, c: F.layer_norm(t, (25,), a, c), x2, w25, b25)
    y, mean, rstd = o.layer_norm_with_stats(x2, w25, b25)
    for got, want in zip(o.layer_norm_backward(_np(dy), x2, w25, mean, rstd), grads):
        np.testing.assert_allclose(got, want, **close)
    dy, grads = _torch_grads(lambda t, a: F.rms_norm(t, (25,), a, 1e-6), x2, w25)
    for got, want in zip(o.rms_norm_backward(_np(dy), x2, w25), grads):
        np.testing.assert_allclose(got, want, **close)

    xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    dy, grads = _torch_grads(lambda t, a, c: F.batch_norm(
        t.permute(0, 3, 1, 2), None, None, a, c, training=True).permute(0, 2, 3, 1), xh, w, b)
    _, sm, si = o.batch_norm(xh, weight=w, bias=b, training=True, layout="NHWC",
                             return_stats=True)
    for got, want in zip(o.batch_norm_backward(_np(dy), xh, sm, si, w, layout="NHWC"), grads):
        np.testing.assert_allclose(got, want, **close)
    dy, grads = _torch_grads(lambda t, a, c: F.group_norm(t, 3, a, c), x, w, b)
    for got, want in zip(o.group_norm_backward(_np(dy), x, 3, w), grads):
        np.testing.assert_allclose(got, want, **close)

    dy, grads = _torch_grads(lambda t, c: F.silu(t + c[:, None, None]), x, b)
    for got, want in zip(o.silu_backward(_np(dy), x, b), grads):
        np.testing.assert_allclose(got, want, **close)
    dy, (gx,) = _torch_grads(lambda t: F.gelu(t, approximate="tanh"), x)
    np.testing.assert_allclose(o.gelu_tanh_backward(_np(dy), x), gx, **close)

    dy, (gx,) = _torch_grads(lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), x)
    y, ind = o.max_pool2d_with_indices(x, 3, 2, 1, ceil_mode=True)
    _, want_ind = F.max_pool2d(torch.tensor(x), 3, 2, 1, ceil_mode=True, return_indices=True)
    assert ind.dtype == np.int32 and np.array_equal(ind, want_ind.numpy())
    np.testing.assert_allclose(o.max_pool2d_backward(_np(dy), ind, x.shape, 3, 2, 1,
                                                     ceil_mode=True), gx, **close)
    dy, (gx,) = _torch_grads(lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False), x)
    np.testing.assert_allclose(o.avg_pool2d_backward(_np(dy), x.shape, 3, 2, 1,
                                                     count_include_pad=False), gx, **close)
    dy, (gx,) = _torch_grads(lambda t: t.mean((1, 2), keepdim=True), xh)
    np.testing.assert_allclose(o.global_avg_pool2d_backward(_np(dy), xh.shape, "NHWC"), gx,
                               **close)


def test_torch_tensors_in_torch_tensors_out() -> None:
    import dnnctl.ops as o

    x = torch.randn(3, 8)
    y = torch.softmax(x, -1)
    dy = torch.randn(3, 8)
    dx = o.softmax_backward(y, dy)
    assert isinstance(dx, torch.Tensor)
    want = y * (dy - (dy * y).sum(-1, keepdim=True))
    assert torch.allclose(dx, want, atol=1e-6)




@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_avg_pool2d_backward_nhwc_on_channels_last_torch_tensors(dtype: str) -> None:
    """The NHWC avg-pool backward on torch CPU tensors (the channels_last storage of an NCHW
    tensor, as a model holds it) against torch's float64 autograd with padding, ceil mode and
    count_include_pad=False. (torch <= 2.11's CUDA channels_last avg-pool backward is the
    one that is wrong with padding, pytorch/pytorch#188344; its CPU kernel is right.)"""
    import dnnctl.ops as o

    gen = torch.Generator().manual_seed(3)
    dt = getattr(torch, dtype)
    x = (torch.randn(2, 16, 15, 17, generator=gen) * 2).to(dt)
    xl = x.contiguous(memory_format=torch.channels_last)  # NCHW shape, NHWC memory
    nhwc = xl.permute(0, 2, 3, 1)  # the same memory as a contiguous NHWC tensor
    assert nhwc.is_contiguous()
    t = x.double().requires_grad_(True)
    y = F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    y.backward(dy)
    dx = o.avg_pool2d_backward(dy.permute(0, 2, 3, 1).contiguous().to(dt), nhwc.shape, 3, 2,
                               1, ceil_mode=True, count_include_pad=False, layout="NHWC")
    assert isinstance(dx, torch.Tensor) and dx.dtype == dt and dx.shape == nhwc.shape
    want = t.grad.permute(0, 2, 3, 1)
    err = float((dx.double() - want).norm() / want.norm())
    assert err < (1e-6 if dtype == "float32" else 8e-3)


@pytest.mark.parametrize("fn", ["relu", "leaky_relu", "relu6", "hardswish", "hardsigmoid"])
def test_activation_gradient_at_the_kinks_is_torchs(fn: str) -> None:
    """Low-precision inputs land exactly on the kinks (0, ±3, 6); the reference gradient
    there is the one torch.autograd gives (hardswish: 0 at -3, 1 at 3)."""
    from dnnctl.ops.activation.reference import act_grad_numpy

    z = np.array([-7, -6, -3.5, -3, -2.5, -1, 0, 1, 2.5, 3, 3.5, 6, 7], dtype=np.float64)
    torch_fn = {"relu": F.relu, "leaky_relu": lambda t: F.leaky_relu(t, 0.01),
                "relu6": F.relu6, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid}[fn]
    t = torch.tensor(z, requires_grad=True)
    (g,) = torch.autograd.grad(torch_fn(t).sum(), t)
    for dtype in (np.float64, np.float32, np.float16):
        np.testing.assert_allclose(act_grad_numpy(fn, z.astype(dtype), 0.01).astype(np.float64),
                                   g.numpy(), rtol=1e-3, atol=0, err_msg=f"{fn} {dtype}")


def test_function_api_on_tensors_that_require_grad():
    """dnnctl.ops functions do not record autograd: writing into a tensor that requires
    grad is refused (torch would have recorded it), a tensor written under no_grad has its
    version bumped (a backward that saved it refuses, as after torch's in-place ops), and
    inputs that require grad draw a warning that the result has none."""
    import warnings

    import dnnctl.ops as o
    from dnnctl.errors import UsageError

    a = torch.randn(5, requires_grad=True)
    t = torch.tanh(a)
    with pytest.raises(UsageError, match="requires grad"):
        o.relu(t, inplace=True)
    with torch.no_grad():
        o.relu(t, inplace=True)
    with pytest.raises(RuntimeError, match="inplace"):
        t.sum().backward()
    import dnnctl.ops.dispatch as d

    d._WARNED.discard("softmax")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = o.softmax(torch.randn(3, 4, requires_grad=True))
    assert not y.requires_grad
    assert any("do not record autograd" in str(w.message) and w.filename == __file__
               for w in caught)


@pytest.mark.parametrize("bad", [-1, 99, 2**31 - 1])
def test_max_pool_backward_refuses_indices_outside_the_input(bad):
    """A negative index wrapped to the last pixel; one past the end was numpy's IndexError."""
    import dnnctl.ops as o
    from dnnctl.errors import UsageError

    ind = torch.full((2, 3, 4, 5), bad, dtype=torch.int32)
    with pytest.raises(UsageError, match=r"indices must lie in \[0, 99\)"):
        o.max_pool2d_backward(torch.randn(2, 3, 4, 5), ind, (2, 3, 9, 11), 3, 2)


def test_training_batch_norm_with_a_read_only_statistic_writes_neither():
    import dnnctl.ops as o
    from dnnctl.errors import ShapeError

    rm, rv = np.zeros(6, np.float32), np.ones(6, np.float32)
    rv.flags.writeable = False
    with pytest.raises(ShapeError, match="running_var is read-only"):
        o.batch_norm(np.random.rand(2, 6, 3, 3).astype(np.float32), rm, rv, training=True)
    assert not rm.any()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_with_a_fused_relu_matches_torch(layout, affine):
    """relu(batch_norm(x)) in one call, and its gradient from x, the saved statistics,
    weight and bias (the ReLU's mask recomputed, no output kept), against torch.autograd."""
    import dnnctl.ops as o

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 5, 5)).astype(np.float32)
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    w = (rng.standard_normal(6) * 0.5 + 1).astype(np.float32) if affine else None
    b = (rng.standard_normal(6) * 0.5).astype(np.float32) if affine else None
    to_nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
    to_x = (lambda t: t.permute(0, 2, 3, 1)) if layout == "NHWC" else (lambda t: t)
    close = dict(rtol=2e-4, atol=2e-5)

    def fwd(t, *ab):
        return to_x(F.relu(F.batch_norm(to_nchw(t), None, None, *ab, training=True)))

    dy, grads = _torch_grads(fwd, x, *((w, b) if affine else ()))
    y, sm, si = o.batch_norm(x, weight=w, bias=b, training=True, layout=layout,
                             return_stats=True, activation="relu")
    want_y = fwd(*(torch.tensor(a, dtype=torch.float64) for a in (x, *((w, b) if affine
                                                                      else ()))))
    np.testing.assert_allclose(y, want_y.numpy(), **close)
    assert (y >= 0).all() and (y == 0).mean() > 0.2  # the ReLU cut a good share
    got = o.batch_norm_backward(_np(dy), x, sm, si, w, layout=layout, bias=b,
                                activation="relu")
    for g, want in zip(got, grads):
        np.testing.assert_allclose(g, want, **close)
    if not affine:
        assert got[1] is None and got[2] is None


def test_batch_norm_relu_backward_needs_the_bias_and_names_bad_activations():
    import dnnctl.ops as o
    from dnnctl.errors import ShapeError, UsageError

    x = np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32)
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    _, sm, si = o.batch_norm(x, weight=w, bias=b, training=True, return_stats=True)
    with pytest.raises(ShapeError, match="needs the forward's bias"):
        o.batch_norm_backward(x, x, sm, si, w, activation="relu")
    with pytest.raises(UsageError, match="activation='gelu' is not fused"):
        o.batch_norm(x, weight=w, bias=b, training=True, activation="gelu")
    with pytest.raises(UsageError, match="activation='silu' is not fused"):
        o.batch_norm_backward(x, x, sm, si, w, bias=b, activation="silu")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batch_norm_with_residual_and_relu_matches_torch(layout):
    """relu(batch_norm(x) + z) (a ResNet block's end) in one call, and its gradients with
    the residual's, against torch.autograd; a residual backward without the ReLU is
    refused (its gradient would be dy itself)."""
    import dnnctl.ops as o
    from dnnctl.errors import UsageError

    rng = np.random.default_rng(5)
    x, z = (rng.standard_normal((4, 6, 5, 5)).astype(np.float32) for _ in range(2))
    if layout == "NHWC":
        x, z = (np.ascontiguousarray(a.transpose(0, 2, 3, 1)) for a in (x, z))
    w = (rng.standard_normal(6) * 0.5 + 1).astype(np.float32)
    b = (rng.standard_normal(6) * 0.5).astype(np.float32)
    to_nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
    to_x = (lambda t: t.permute(0, 2, 3, 1)) if layout == "NHWC" else (lambda t: t)
    close = dict(rtol=2e-4, atol=2e-5)

    def fwd(t, a, c, r):
        return to_x(F.relu(F.batch_norm(to_nchw(t), None, None, a, c, training=True)
                           + to_nchw(r)))

    dy, grads = _torch_grads(fwd, x, w, b, z)
    y, sm, si = o.batch_norm(x, weight=w, bias=b, training=True, layout=layout,
                             return_stats=True, activation="relu", residual=z)
    want = fwd(*(torch.tensor(a, dtype=torch.float64) for a in (x, w, b, z)))
    np.testing.assert_allclose(y, want.numpy(), **close)
    got = o.batch_norm_backward(_np(dy), x, sm, si, w, layout=layout, bias=b,
                                activation="relu", residual=z)
    assert len(got) == 4
    for g, ref in zip(got, grads):
        np.testing.assert_allclose(g, ref, **close)
    with pytest.raises(UsageError, match="residual= is for activation='relu'"):
        o.batch_norm_backward(_np(dy), x, sm, si, w, layout=layout, residual=z)
