"""conv2d dgrad / wgrad and matmul backward on the numpy backend: the float64 references
against torch's own gradients (torch.nn.grad, autograd, CPU float64), the public functions
(NumPy and torch CPU tensors), their argument errors, and tune -> plan -> dispatch of backward
problems with real worker processes."""

from __future__ import annotations

import numpy as np
import pytest

import dnnctl
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import registry
from dnnctl.tune.timer import TimingPolicy
from dnnctl.tune.tuner import TuneOptions, tune
from dnnctl.workloads import Workload

torch = pytest.importorskip("torch")
OP = registry.get_op("conv2d")

SHAPES = [  # (n, c, h, w, k, r, s, stride, pad, dilation, groups)
    (2, 6, 9, 8, 4, 3, 3, 2, 1, 1, 1),
    (1, 4, 7, 9, 6, 3, 2, 1, 2, 2, 2),
    (2, 6, 7, 5, 12, 3, 3, 2, 1, 1, 6),
    (1, 5, 6, 7, 3, 1, 1, 2, 0, 1, 1),
    (3, 3, 11, 10, 8, 5, 5, 3, 2, 1, 1),
]


def _key(shape, which, layout="NCHW", dtype="float32", bias=False):
    n, c, h, w, k, r, s, st, pad, dil, g = shape
    return dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=st, pad=pad, dilation=dil, groups=g,
                dtype=dtype, layout=layout, bias=bias, **{"pass": which})


def _torch_grads(shape, x, w, dy):
    _, _, _, _, _, _, _, st, pad, dil, g = shape
    tx, tw, tdy = (torch.from_numpy(np.ascontiguousarray(a)) for a in (x, w, dy))
    dx = torch.nn.grad.conv2d_input(tuple(tx.shape), tw, tdy, st, pad, dil, g)
    dw = torch.nn.grad.conv2d_weight(tx, tuple(tw.shape), tdy, st, pad, dil, g)
    return dx.numpy(), dw.numpy(), tdy.sum(dim=(0, 2, 3)).numpy()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{i}" for i in range(len(SHAPES))])
def test_references_match_torch_grads(shape, layout):
    rng = np.random.default_rng(3)
    pd = OP.problem(_key(shape, "dgrad", layout, "float32"))
    pw = OP.problem(_key(shape, "wgrad", layout, "float32", bias=True))
    ins = OP.make_inputs(pw, rng)
    w = OP.make_inputs(pd, rng)["w"]
    x64, dy64, w64 = (a.astype(np.float64) for a in (ins["x"], ins["dy"], w))
    nchw = (lambda a: a.transpose(0, 3, 1, 2)) if layout == "NHWC" else (lambda a: a)
    dx_t, dw_t, db_t = _torch_grads(shape, nchw(x64), nchw(w64), nchw(dy64))
    dx = OP.reference(pd, {"dy": dy64, "w": w64}, {})["dx"]
    out = OP.reference(pw, {"x": x64, "dy": dy64}, {})
    np.testing.assert_allclose(nchw(dx), dx_t, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(nchw(out["dw"]), dw_t, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["db"], db_t, rtol=1e-10, atol=1e-12)


def test_backward_keys_and_specs():
    pd = OP.problem(_key(SHAPES[0], "dgrad"))
    assert set(OP.input_specs(pd)) == {"dy", "w"} and set(OP.output_specs(pd)) == {"dx"}
    assert OP.output_specs(pd)["dx"].shape == (2, 6, 9, 8)
    pw = OP.problem(_key(SHAPES[0], "wgrad", bias=True))
    assert set(OP.input_specs(pw)) == {"x", "dy"}
    assert {n: s.shape for n, s in OP.output_specs(pw).items()} == {"dw": (4, 6, 3, 3),
                                                                     "db": (4,)}
    assert OP.flops(pd) == OP.flops(pw) == OP.flops(OP.problem(
        {k: v for k, v in _key(SHAPES[0], "dgrad").items() if k != "pass"}))
    fwd = OP.problem({k: v for k, v in _key(SHAPES[0], "dgrad").items() if k != "pass"})
    assert fwd["pass"] == "forward" and fwd != pd
    with pytest.raises(UsageError, match="bias=true has no meaning"):
        OP.problem(_key(SHAPES[0], "dgrad", bias=True))
    with pytest.raises(UsageError, match="activation / residual"):
        OP.problem(dict(_key(SHAPES[0], "wgrad"), activation="relu"))
    with pytest.raises(UsageError, match="not one of"):
        OP.problem(dict(_key(SHAPES[0], "wgrad"), **{"pass": "backward"}))
    # wgrad's tolerance widens with the reduction length for float32 only
    big = OP.problem(dict(_key(SHAPES[0], "wgrad"), n=64, h=128, w=128))
    assert OP.tolerance(big, "dw") > OP.tolerance(pw, "dw") == 1e-5
    assert OP.tolerance(OP.problem(dict(_key(SHAPES[0], "wgrad"), n=64, h=128, w=128,
                                        dtype="float16")), "dw") == 2e-3


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=["s0", "s1", "s2"])
def test_public_gradients_match_torch(shape, layout):
    n, c, h, w, k, r, s, st, pad, dil, g = shape
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((k, c // g, r, s)).astype(np.float32)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, st, pad,
                                   dil, g)
    dy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    dx_t, dw_t, db_t = _torch_grads(shape, x, wt, dy)
    to = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if layout == "NHWC" \
        else (lambda a: a)
    back = (lambda a: a.transpose(0, 3, 1, 2)) if layout == "NHWC" else (lambda a: a)
    kw = dict(stride=st, padding=pad, dilation=dil, groups=g, layout=layout)
    dx = dnnctl.ops.conv2d_backward_data(to(dy), to(wt), to(x).shape, **kw)
    dw, db = dnnctl.ops.conv2d_backward_weight(to(x), to(dy), to(wt).shape, **kw)
    assert isinstance(dx, np.ndarray) and dx.dtype == np.float32
    np.testing.assert_allclose(back(dx), dx_t, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(back(dw), dw_t, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, db_t, rtol=1e-4, atol=1e-4)
    # torch CPU tensors in, torch tensors out (the numpy backend through DLPack)
    tdx = dnnctl.ops.conv2d_backward_data(torch.from_numpy(to(dy)), torch.from_numpy(to(wt)),
                                          to(x).shape, **kw)
    assert isinstance(tdx, torch.Tensor) and np.allclose(tdx.numpy(), dx)
    tdw, tdb = dnnctl.ops.conv2d_backward_weight(torch.from_numpy(to(x)),
                                                 torch.from_numpy(to(dy)), to(wt).shape,
                                                 bias_grad=False, **kw)
    assert isinstance(tdw, torch.Tensor) and tdb is None and np.allclose(tdw.numpy(), dw)


def test_public_gradient_errors():
    x = np.zeros((2, 4, 8, 8), np.float32)
    w = np.zeros((6, 4, 3, 3), np.float32)
    dy = np.zeros((2, 6, 6, 6), np.float32)
    with pytest.raises(ShapeError, match=r"dy has shape \(2, 6, 6, 6\), expected \(2, 6, 8, 8\)"):
        dnnctl.ops.conv2d_backward_data(dy, w, x.shape, padding=1)
    with pytest.raises(ShapeError, match="input channels per group"):
        dnnctl.ops.conv2d_backward_weight(x, dy, (6, 3, 3, 3))
    with pytest.raises(ShapeError, match="mix dtypes"):
        dnnctl.ops.conv2d_backward_data(dy.astype(np.float16), w, x.shape)
    with pytest.raises(UsageError, match="layout"):
        dnnctl.ops.conv2d_backward_data(dy, w, x.shape, layout="CHWN")


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("batched", [False, True])
def test_matmul_backward_matches_autograd(activation, batched):
    rng = np.random.default_rng(11)
    a_shape = (3, 5, 7) if batched else (5, 7)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = (rng.standard_normal((7, 6)) / 3).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    ta, tb, tbias = (torch.from_numpy(v.astype(np.float64)).requires_grad_() for v in
                     (a, b, bias))
    pre_t = ta @ tb + tbias
    act = {None: lambda v: v, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu": torch.nn.functional.gelu}[activation]
    y = act(pre_t)
    dy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.from_numpy(dy.astype(np.float64)))
    pre = pre_t.detach().numpy().astype(np.float32)
    da, db, dbias = dnnctl.ops.matmul_backward(dy, a, b, pre=pre, activation=activation)
    assert da.shape == a.shape and db.shape == b.shape and dbias.shape == (6,)
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbias, tbias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_matmul_backward_torch_tensors_and_errors():
    a = torch.randn(4, 3)
    b = torch.randn(3, 5)
    dy = torch.randn(4, 5)
    da, db, dbias = dnnctl.ops.matmul_backward(dy, a, b, bias_grad=False)
    assert isinstance(da, torch.Tensor) and dbias is None
    assert torch.allclose(da, dy @ b.T, atol=1e-5) and torch.allclose(db, a.T @ dy, atol=1e-5)
    with pytest.raises(UsageError, match="needs pre"):
        dnnctl.ops.matmul_backward(dy, a, b, activation="relu")
    with pytest.raises(ShapeError, match="dy has shape"):
        dnnctl.ops.matmul_backward(dy.T.contiguous(), a, b)
    with pytest.raises(UsageError, match="not supported"):
        dnnctl.ops.matmul_backward(dy, a, b, pre=dy, activation="tanh")


def test_tune_plan_dispatch_backward_problems(tmp_path, monkeypatch):
    """A workload of a dgrad and a wgrad problem tunes on the numpy backend (only the
    variants of each pass are candidates), and the public calls run the planned choice."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    wl = Workload("backward")
    base = dict(n=2, c=16, h=12, w=12, k=16, r=3, s=3, pad=1, stride=2, dtype="float32",
                layout="NCHW")
    d = wl.add("conv2d", dict(base, **{"pass": "dgrad"}))
    w = wl.add("conv2d", dict(base, bias=True, **{"pass": "wgrad"}))
    policy = TimingPolicy.for_backend("numpy").replace(warmup_ms=1.0, budget_ms=5.0,
                                                       retime_budget_ms=3.0)
    report = tune(wl, TuneOptions(device="cpu", output=tmp_path / "plan.yaml", policy=policy))
    assert [o.status for o in report.outcomes] == ["planned", "planned"]
    plan = dnnctl.load_plan(str(tmp_path / "plan.yaml"), device="cpu", strict=True)
    entries = {e.problem: e for e in plan.plan.sections[0].entries}
    assert entries[d].choice.variant.startswith("dgrad_")
    assert entries[w].choice.variant.startswith("wgrad_")
    assert entries[w].tried == 3  # im2col chunk 0 / 1 and direct: the wgrad variants only
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    wt = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 6, 6)).astype(np.float32)
    with dnnctl.use_plan(plan):
        dx = dnnctl.ops.conv2d_backward_data(dy, wt, x.shape, stride=2, padding=1)
        dw, db = dnnctl.ops.conv2d_backward_weight(x, dy, wt.shape, stride=2, padding=1)
    st = plan.stats()
    assert st.hits == {d: 1, w: 1}
    dx_t, dw_t, db_t = _torch_grads((2, 16, 12, 12, 16, 3, 3, 2, 1, 1, 1), x, wt, dy)
    assert np.allclose(dx, dx_t, atol=1e-4) and np.allclose(dw, dw_t, atol=1e-3)
    assert np.allclose(db, db_t, atol=1e-4)
