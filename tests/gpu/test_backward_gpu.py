"""GPU tests of the public backward functions on torch CUDA tensors against torch.autograd on
the same tensors (every dtype), and of batch_norm training (forward + backward) across the
training variants. The registry-wide variant checks of the backward problems (poisoned
outputs, float64 references, edge shapes) are in test_kernels_memory.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

TOL = {"float32": 5e-5, "float16": 5e-3, "bfloat16": 3e-2}


def _err(ours: Any, theirs: Any, scale: Any = None) -> float:
    """‖ours − theirs‖ / ‖max(|theirs|, scale)‖: ``scale`` is the magnitude of the terms a
    gradient is the sum of (the ops' error scales, dnnctl.ops.base.Op.error_scale): where they
    cancel (a row of length 1 has dx = 0 exactly) a correct float32 result carries rounding
    error relative to them, not to the zero."""
    from dnnctl.ops.base import rel_norm_error

    return rel_norm_error(ours.double().cpu().numpy(), theirs.double().cpu().numpy(),
                          None if scale is None else np.asarray(scale, np.float64))


def _np64(*ts: Any) -> list[Any]:
    return [None if t is None else t.double().cpu().numpy() for t in ts]


def _grads(fn: Any, *tensors: Any, seed: int = 0) -> tuple[Any, list[Any]]:
    """torch's gradients of sum(fn(*tensors) * dy), computed in float64 (a float32 reference
    carries its own rounding: for a row of length 1 its x - mean is not 0, so its dweight is
    noise where the exact one, and ours, is 0)."""
    leaves = [t.detach().double().requires_grad_(True) for t in tensors]
    y = fn(*leaves)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dy = torch.randn(y.shape, device="cuda", generator=gen, dtype=torch.float64)
    y.backward(dy)
    return dy.to(tensors[0].dtype), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_backward_functions_match_torch_autograd(dtype: str) -> None:
    import torch.nn.functional as F

    import dnnctl.ops as ops

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dt)

    from dnnctl.ops.rownorm.backward import row_stats, rownorm_dx_scale
    from dnnctl.ops.softmax.backward import softmax_dx_scale

    tol = TOL[dtype]
    for cols in (1, 197, 768, 4097, 50000):
        s = randn(9, cols, scale=3)
        for log in (False, True):
            y = ops.log_softmax(s) if log else ops.softmax(s)
            dy, (gx,) = _grads(lambda t, log=log: (torch.log_softmax if log else
                                                   torch.softmax)(t, -1), s)
            got = (ops.log_softmax_backward if log else ops.softmax_backward)(y, dy)
            assert _err(got, gx, softmax_dx_scale(*_np64(y, dy), log)) <= tol, (
                "log_softmax" if log else "softmax", cols)
        w, b = randn(cols), randn(cols)
        _, mean, rstd = ops.layer_norm_with_stats(s, w, b)
        dy, want = _grads(lambda t, a, c, n=cols: F.layer_norm(t, (n,), a, c), s, w, b)
        dys, xs, ws, ms, rs = _np64(dy, s, w, mean, rstd)
        # dweight = sum over rows of dy (x - mean) rstd: torch recomputes the mean, so its
        # x - mean carries rounding relative to |x| + |mean| (not 0 for a row of length 1)
        dw_scale = (np.abs(dys) * (np.abs(xs) + np.abs(ms)[:, None]) * rs[:, None]).sum(0)
        scales = (rownorm_dx_scale(dys, xs, ws, ms, rs, rms=False), dw_scale, None)
        for got, ref, sc in zip(ops.layer_norm_backward(dy, s, w, mean, rstd), want, scales):
            assert _err(got, ref, sc) <= 4 * tol, ("layer_norm", cols)
        dy, want = _grads(lambda t, a, n=cols: F.rms_norm(t, (n,), a, 1e-6), s, w)
        xs, dys, ws = _np64(s, dy, w)
        scale = rownorm_dx_scale(dys, xs, ws, None, row_stats(xs, 1e-6, rms=True)[1], rms=True)
        for got, ref, sc in zip(ops.rms_norm_backward(dy, s, w), want, (scale, None)):
            assert _err(got, ref, sc) <= 4 * tol, ("rms_norm", cols)

    x = randn(8, 64, 15, 17, scale=2)
    xl = x.permute(0, 2, 3, 1).contiguous()
    w32 = torch.rand(64, device="cuda") + 0.5
    b32 = torch.randn(64, device="cuda")
    for xi, layout in ((x, "NCHW"), (xl, "NHWC")):
        _, sm, si = ops.batch_norm(xi, weight=w32, bias=b32, training=True, layout=layout,
                                   return_stats=True)

        def bn(t: Any, a: Any, c: Any, layout: str = layout) -> Any:
            t4 = t if layout == "NCHW" else t.permute(0, 3, 1, 2)
            out = F.batch_norm(t4, None, None, a, c, training=True)
            return out if layout == "NCHW" else out.permute(0, 2, 3, 1)

        dy, want = _grads(bn, xi, w32, b32)
        for got, ref in zip(ops.batch_norm_backward(dy, xi, sm, si, w32, layout=layout), want):
            assert _err(got, ref) <= 4 * tol, ("batch_norm", layout)
        dy, want = _grads(lambda t, a, c, layout=layout: (
            F.group_norm(t, 8, a, c) if layout == "NCHW" else
            F.group_norm(t.permute(0, 3, 1, 2), 8, a, c).permute(0, 2, 3, 1)), xi, w32, b32)
        for got, ref in zip(ops.group_norm_backward(dy, xi, 8, w32, layout=layout), want):
            assert _err(got, ref) <= 4 * tol, ("group_norm", layout)

    bias = randn(64)
    for name, fn in (("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu),
                     ("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("relu6", F.relu6),
                     ("hardswish", F.hardswish), ("hardsigmoid", F.hardsigmoid)):
        dy, (gx, gb) = _grads(lambda t, c, fn=fn: fn(t + c[None, :, None, None]), x, bias)
        dx, db = getattr(ops, f"{name}_backward")(dy, x, bias)
        assert _err(dx, gx) <= tol and _err(db, gb) <= 4 * tol, name
        dy, (gx,) = _grads(fn, xl)
        assert _err(getattr(ops, f"{name}_backward")(dy, xl), gx) <= tol, name

    for xi, layout in ((x, "NCHW"), (xl, "NHWC")):
        def to4(t: Any, layout: str = layout) -> Any:
            return t if layout == "NCHW" else t.permute(0, 3, 1, 2)

        def back(t: Any, layout: str = layout) -> Any:
            return t if layout == "NCHW" else t.permute(0, 2, 3, 1)

        y, ind = ops.max_pool2d_with_indices(xi, 3, 2, 1, layout=layout)
        ty, tind = F.max_pool2d(to4(xi), 3, 2, 1, return_indices=True)
        assert torch.equal(back(tind).to(torch.int32), ind) and torch.equal(back(ty), y)
        dy, (gx,) = _grads(lambda t: back(F.max_pool2d(to4(t), 3, 2, 1)), xi)
        dx = ops.max_pool2d_backward(dy, ind, xi.shape, 3, 2, 1, layout=layout)
        assert _err(dx, gx) <= tol, ("max_pool2d", layout)
        # torch's reference through its NCHW kernel: its channels_last CUDA avg_pool2d
        # backward misplaces every window when padding > 0 (pytorch/pytorch#188344, fixed
        # after torch 2.11), so a channels_last autograd gradient is not a reference here
        dy, (gx,) = _grads(lambda t: back(F.avg_pool2d(to4(t).contiguous(), 3, 2, 1,
                                                       ceil_mode=True,
                                                       count_include_pad=False)), xi)
        dx = ops.avg_pool2d_backward(dy, xi.shape, 3, 2, 1, ceil_mode=True,
                                     count_include_pad=False, layout=layout)
        assert _err(dx, gx) <= tol, ("avg_pool2d", layout)
        dy, (gx,) = _grads(lambda t: back(F.adaptive_avg_pool2d(to4(t), 1)), xi)
        dx = ops.global_avg_pool2d_backward(dy, xi.shape, layout=layout)
        assert _err(dx, gx) <= tol, ("global_avg_pool2d", layout)


@pytest.mark.parametrize("variant", ["train_fused", "train_two_pass", "train_stream",
                                     "train_lastblock"])
def test_batch_norm_training_variants_repeat_exactly(variant: str) -> None:
    """Each training variant run twice on one tensor gives identical statistics (the
    fold order is fixed, counters reset) and matches torch's training batch_norm."""
    import torch.nn.functional as F

    from dnnctl.backends.registry import get_backend
    from dnnctl.ops.registry import get_op, get_variant

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    be = get_backend("cupy")
    dev = be.device(0)
    op = get_op("batch_norm")
    x = torch.randn(32, 56, 56, 64, device="cuda").half() * 1.5 + 3.0
    problem = op.problem(n=32, c=64, h=56, w=56, dtype="float16", layout="NHWC",
                         training=True)
    v = get_variant("batch_norm", "cupy", variant)
    params = max(v.param_space(problem, dev), key=lambda p: p.get("vec", 0))  # widest
    kern = v.build(problem, params, dev)
    ins = {"x": cupy.from_dlpack(x), "running_mean": cupy.zeros(64, cupy.float32),
           "running_var": cupy.ones(64, cupy.float32),
           "weight": cupy.ones(64, cupy.float32), "bias": cupy.zeros(64, cupy.float32)}
    runs = []
    for _ in range(2):
        outs = {k: cupy.empty(s.shape, cupy.float16 if k == "y" else cupy.float32)
                for k, s in op.output_specs(problem).items()}
        kern(ins, outs, {"eps": 1e-5, "momentum": 0.1})
        runs.append(outs)
    for k in ("save_mean", "save_invstd"):
        assert cupy.array_equal(runs[0][k], runs[1][k]), k
    want = F.batch_norm(x.permute(0, 3, 1, 2).float(), None, None, training=True)
    got = torch.from_dlpack(runs[0]["y"]).permute(0, 3, 1, 2).float()
    assert _err(got, want) <= 5e-3
