"""Gradients of the torch.ops.dnnctl ops on dnnctl's own backward kernels (torch CPU tensors
-> numpy backend) against torch autograd, and the plan / mode switch between dnnctl and torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dnnctl.torch as dt  # noqa: E402
from dnnctl.backends.registry import get_backend  # noqa: E402
from dnnctl.errors import UsageError  # noqa: E402
from dnnctl.ops.dispatch import problem_of, use_plan  # noqa: E402
from dnnctl.ops.registry import get_op  # noqa: E402
from dnnctl.plan import Plan  # noqa: E402
from dnnctl.plan.loaded import LoadedPlan  # noqa: E402
from dnnctl.torch import grad_plan, kernels  # noqa: E402
from dnnctl.torch import own_grads as og  # noqa: E402
from tests.unit._plan_helpers import entry, numpy_section  # noqa: E402

OPS = torch.ops.dnnctl
DNN = kernels.plan_handle(None, "dnnctl")
CL = torch.channels_last


def _grads(fn, ref, *inputs, seed=0):
    """(relative max error per input gradient, backward paths) of fn vs ref."""
    torch.manual_seed(seed)
    a = [t.clone().requires_grad_(True) for t in inputs]
    b = [t.clone().requires_grad_(True) for t in inputs]
    grad_plan.BACKWARD_PATHS.clear()
    y = fn(*a)
    g = torch.randn_like(y)
    y.backward(g)
    paths = grad_plan.paths_summary()
    ref(*b).backward(g)
    errs = [float((u.grad - v.grad).abs().max() / v.grad.abs().max().clamp_min(1e-12))
            for u, v in zip(a, b)]
    return errs, paths


def _all_dnnctl(paths):
    return paths and all(v["torch"] == 0 and v["dnnctl"] > 0 for v in paths.values())


def _cl(t):
    return t.contiguous(memory_format=CL)


@pytest.mark.parametrize("fmt", ["nchw", "channels_last"])
@pytest.mark.parametrize("stride,pad,dil,groups", [(1, (1, 1), 1, 1), (2, (1, 1), 1, 2),
                                                   (2, (0, 1, 1, 0), 1, 1), (1, (2, 2), 2, 4)])
def test_conv2d_gradients_on_dnnctl_match_torch(fmt, stride, pad, dil, groups):
    x, w, b = torch.randn(2, 8, 9, 9), torch.randn(12, 8 // groups, 3, 3), torch.randn(12)
    if fmt == "channels_last":
        x, w = _cl(x), _cl(w)

    def ref(x, w, b):
        xp = x
        if len(pad) == 4:
            xp, p = F.pad(x, (pad[2], pad[3], pad[0], pad[1])), 0
        else:
            p = pad
        return F.conv2d(xp, w, b, stride, p, dil, groups)

    errs, paths = _grads(lambda x, w, b: OPS.conv2d(x, w, b, [stride] * 2, list(pad),
                                                    [dil] * 2, groups, "none", None, DNN),
                         ref, x, w, b)
    assert max(errs) < 1e-5, errs
    assert paths == {"conv2d/dgrad": {"dnnctl": 1, "torch": 0},
                     "conv2d/wgrad": {"dnnctl": 1, "torch": 0}}


def _bn_train_case(relu: bool, channels_last: bool) -> tuple:
    """Training batch_norm (with its fused ReLU) against torch's, channels-last or NCHW."""
    act = "relu" if relu else "none"

    def ref(x, w, b):
        y = F.batch_norm(x, torch.zeros(8), torch.ones(8), w, b, True, 0.1, 1e-5)
        return F.relu(y) if relu else y

    def make():
        x = torch.randn(3, 8, 5, 7)
        return (_cl(x) if channels_last else x), torch.randn(8), torch.randn(8)

    return (lambda x, w, b: OPS.batch_norm_train(x, torch.zeros(8), torch.ones(8), w, b, 0.1,
                                                 1e-5, DNN, act)[0], ref, make)


CASES = {
    "layer_norm": (lambda x, w, b: OPS.layer_norm(x, w, b, 1e-5, DNN),
                   lambda x, w, b: F.layer_norm(x, (32,), w, b, 1e-5),
                   lambda: (torch.randn(3, 5, 32), torch.randn(32), torch.randn(32))),
    "rms_norm": (lambda x, w: OPS.rms_norm(x, w, 1e-6, DNN),
                 lambda x, w: F.rms_norm(x, (32,), w, 1e-6),
                 lambda: (torch.randn(6, 32), torch.randn(32))),
    "softmax": (lambda x: OPS.softmax(x, 1, DNN), lambda x: F.softmax(x, 1),
                lambda: (torch.randn(4, 7, 5),)),
    "log_softmax": (lambda x: OPS.log_softmax(x, -1, DNN), lambda x: F.log_softmax(x, -1),
                    lambda: (torch.randn(6, 33),)),
    **{f"batch_norm_train{relu}{fmt}": _bn_train_case(relu == "_relu", fmt == "")
       for relu in ("", "_relu") for fmt in ("", "_nchw")},
    "group_norm": (lambda x, w, b: OPS.group_norm(x, 4, w, b, 1e-5, DNN),
                   lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5),
                   lambda: (_cl(torch.randn(2, 8, 5, 6)), torch.randn(8), torch.randn(8))),
    "max_pool2d": (lambda x: OPS.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], True, DNN),
                   lambda x: F.max_pool2d(x, 3, 2, 1, 1, True),
                   lambda: (_cl(torch.randn(2, 4, 9, 8)),)),
    "avg_pool2d": (lambda x: OPS.avg_pool2d(x, [3, 3], [2, 2], [1, 1], False, False, DNN),
                   lambda x: F.avg_pool2d(x, 3, 2, 1, False, False),
                   lambda: (torch.randn(2, 4, 9, 8),)),
    "global_avg_pool2d": (lambda x: OPS.global_avg_pool2d(x, DNN),
                          lambda x: x.mean((2, 3), keepdim=True),
                          lambda: (_cl(torch.randn(2, 6, 5, 5)),)),
    "relu": (lambda x: OPS.relu(x, DNN), F.relu, lambda: (_cl(torch.randn(2, 4, 3, 5)),)),
    "silu": (lambda x: OPS.silu(x, DNN), F.silu, lambda: (torch.randn(5, 9),)),
    "sigmoid": (lambda x: OPS.sigmoid(x, DNN), torch.sigmoid, lambda: (torch.randn(5, 9),)),
    "tanh": (lambda x: OPS.tanh(x, DNN), torch.tanh, lambda: (torch.randn(5, 9),)),
    "gelu": (lambda x: OPS.gelu(x, "none", DNN), F.gelu, lambda: (torch.randn(5, 9),)),
    "gelu_tanh": (lambda x: OPS.gelu(x, "tanh", DNN), lambda x: F.gelu(x, approximate="tanh"),
                  lambda: (torch.randn(5, 9),)),
    "leaky_relu": (lambda x: OPS.leaky_relu(x, 0.2, DNN), lambda x: F.leaky_relu(x, 0.2),
                   lambda: (torch.randn(5, 9),)),
    "relu6": (lambda x: OPS.relu6(x, DNN), F.relu6, lambda: (_cl(4 * torch.randn(2, 4, 3, 5)),)),
    "hardswish": (lambda x: OPS.hardswish(x, DNN), F.hardswish,
                  lambda: (4 * torch.randn(5, 9),)),
    "hardsigmoid": (lambda x: OPS.hardsigmoid(x, DNN), F.hardsigmoid,
                    lambda: (4 * torch.randn(5, 9),)),
    "linear": (lambda x, w, b: OPS.linear(x, w, b, "none", DNN), F.linear,
               lambda: (torch.randn(3, 5, 32), torch.randn(16, 32), torch.randn(16))),
    "matmul_batched": (lambda a, b: OPS.matmul(a, b, DNN), torch.matmul,
                       lambda: (torch.randn(3, 5, 7), torch.randn(3, 7, 4))),
    "matmul_shared_b": (lambda a, b: OPS.matmul(a, b, DNN), torch.matmul,
                        lambda: (torch.randn(3, 5, 7), torch.randn(7, 4))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_gradients_on_dnnctl_match_torch(name):
    fn, ref, make = CASES[name]
    errs, paths = _grads(fn, ref, *make())
    assert max(errs) < 2e-5, errs
    assert _all_dnnctl(paths), paths


@pytest.mark.parametrize("rms", [False, True])
def test_row_stats_are_torchs_one_pass_statistics(rms):
    """The statistics the dnnctl backward gets from torch's reductions: float64 truth for a
    float32 tensor; none where torch would round them to 16 bits (the backward's own
    float32 recompute then runs)."""
    rows = torch.randn(37, 48, generator=torch.Generator().manual_seed(3)) * 3 + 1.5
    mean, rstd = og.row_stats(rows, 1e-5, rms)
    r64 = rows.double()
    if rms:
        assert mean is None
        want = torch.rsqrt(r64.pow(2).mean(-1) + 1e-5)
    else:
        torch.testing.assert_close(mean.double(), r64.mean(-1), rtol=1e-6, atol=1e-6)
        want = torch.rsqrt(r64.var(-1, unbiased=False) + 1e-5)
    assert rstd.shape == (37,) and rstd.dtype == torch.float32
    torch.testing.assert_close(rstd.double(), want, rtol=1e-5, atol=0)
    assert og.row_stats(rows.bfloat16(), 1e-5, rms) == (None, None)


def test_float64_runs_torch_formula_even_when_forced():
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: OPS.layer_norm(t, None, None, 1e-5, DNN), (x,))
    grad_plan.BACKWARD_PATHS.clear()
    OPS.layer_norm(x, None, None, 1e-5, DNN).sum().backward()
    assert grad_plan.paths_summary() == {"layer_norm/backward": {"dnnctl": 0, "torch": 1}}


def _numpy_choice(op, key):
    problem = problem_of(get_op(op), grad_plan.hashable(key))
    return problem, get_op(op).default_choice(problem, "numpy", get_backend("numpy").device(0))


def _plan_for(*items):
    entries = []
    for op, key in items:
        problem, choice = _numpy_choice(op, key)
        entries.append(entry(problem, choice.variant, choice.param_dict))
    return LoadedPlan(Plan([numpy_section(entries)]))


def test_plan_entry_switches_each_backward_problem():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3, requires_grad=True)
    dgrad = og.conv2d_keys(x, w, False, (1, 1), (1, 1), (1, 1), 1, True, True)["dgrad"]
    ln_x = torch.randn(3, 16)
    ln = og.rownorm_keys("layer_norm", ln_x, False, False)["backward"]
    plan = _plan_for(dgrad, ln)
    handle = dt.plan_handle(plan)  # backward="plan" (the default)
    xr = x.clone().requires_grad_(True)
    grad_plan.BACKWARD_PATHS.clear()
    OPS.conv2d(xr, w, None, [1, 1], [1, 1], [1, 1], 1, "none", None, handle).sum().backward()
    OPS.layer_norm(ln_x.clone().requires_grad_(True), None, None, 1e-5,
                   handle).sum().backward()
    assert grad_plan.paths_summary() == {
        "conv2d/dgrad": {"dnnctl": 1, "torch": 0},  # in the plan
        "conv2d/wgrad": {"dnnctl": 0, "torch": 1},  # not in the plan: torch's formula
        "layer_norm/backward": {"dnnctl": 1, "torch": 0}}
    hits = {p.get("pass", "forward") for p in plan.stats().hits if p.op == "conv2d"}
    assert hits == {"dgrad"}  # dnnctl's dgrad call looked its entry up in the plan
    ref = x.clone().requires_grad_(True)
    F.conv2d(ref, w.detach(), None, 1, 1).sum().backward()
    assert torch.allclose(xr.grad, ref.grad, atol=1e-5)


def test_dnnctl_mode_runs_torchs_formula_where_a_vendor_is_picked(monkeypatch):
    """backward="dnnctl": a problem whose pick (here the plan's entry) is a vendor variant
    runs torch's own formula, the same library call, as the forward's torch_runs does; an
    entry naming dnnctl's own kernel runs it. The vendor variant is registered for this
    test only (the CPU has none: cuDNN's and cuBLAS's are CUDA variants)."""
    from dnnctl.ops import registry

    own = registry.get_variant("layer_norm", "numpy", "bwd_numpy")
    vendor_cls = type("VendorLayerNormBwd", (type(own),),
                      {"name": "bwd_vendor_test", "vendor": True, "__module__": __name__})
    monkeypatch.setitem(registry._VARIANTS[("layer_norm", "numpy")], "bwd_vendor_test",
                        vendor_cls())
    x = torch.randn(3, 16)
    problem = problem_of(get_op("layer_norm"), grad_plan.hashable(
        og.rownorm_keys("layer_norm", x, False, False)["backward"][1]))

    def paths(variant):
        plan = LoadedPlan(Plan([numpy_section([entry(problem, variant, {})])]))
        grad_plan.BACKWARD_PATHS.clear()
        OPS.layer_norm(x.clone().requires_grad_(True), None, None, 1e-5,
                       kernels.plan_handle(plan, "dnnctl")).sum().backward()
        return grad_plan.paths_summary()["layer_norm/backward"]

    assert paths("bwd_vendor_test") == {"dnnctl": 0, "torch": 1}
    assert paths("bwd_numpy") == {"dnnctl": 1, "torch": 0}


def test_no_plan_means_torch_and_active_plan_counts():
    x = torch.randn(3, 16)
    key = og.rownorm_keys("layer_norm", x, False, False)["backward"]
    plan = _plan_for(key)

    def run(handle):
        grad_plan.BACKWARD_PATHS.clear()
        OPS.layer_norm(x.clone().requires_grad_(True), None, None, 1e-5,
                       handle).sum().backward()
        return grad_plan.paths_summary()["layer_norm/backward"]

    assert run(0) == {"dnnctl": 0, "torch": 1}  # no plan at all
    with use_plan(plan):
        assert run(0) == {"dnnctl": 1, "torch": 0}  # the active plan has the entry
        assert run(dt.plan_handle(None, "torch")) == {"dnnctl": 0, "torch": 1}
    empty = LoadedPlan(Plan([numpy_section([])]))
    assert run(dt.plan_handle(empty)) == {"dnnctl": 0, "torch": 1}
    assert run(dt.plan_handle(empty, "dnnctl")) == {"dnnctl": 1, "torch": 0}


def test_patch_backward_mode_and_bad_mode():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)).train()
    with pytest.raises(UsageError, match="backward"):
        dt.patch(model, None, backward="cudnn")
    ref = nn.Sequential(*[m for m in __import__("copy").deepcopy(model)])
    x = torch.randn(2, 3, 6, 6)
    grad_plan.BACKWARD_PATHS.clear()
    with dt.patched(model, None, backward="dnnctl"):
        model(x).square().sum().backward()
    paths = grad_plan.paths_summary()
    # the ReLU runs inside batch_norm's (fused: its mask recomputed in batch_norm's backward)
    assert _all_dnnctl(paths) and set(paths) >= {"conv2d/wgrad", "batch_norm/backward",
                                                 "matmul/wgrad"}
    assert "activation/backward" not in paths
    assert "conv2d/dgrad" not in paths  # the input needs no gradient
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_record_train_notes_the_backward_keys_that_run():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3),
                          nn.Flatten(), nn.Linear(64, 2)).train()
    model = model.to(memory_format=CL)
    wl = dt.record(model, _cl(torch.randn(2, 3, 6, 6)), train=True)
    conv = sorted((p["pass"], p["c"]) for p in wl.problems
                  if p.op == "conv2d" and p.get("pass", "forward") != "forward")
    assert conv == [("dgrad", 4), ("wgrad", 3), ("wgrad", 4)]  # no dgrad for the input
    assert all(p["layout"] == "NHWC" and p["activation"] == "none" for p in wl.problems
               if p.op == "conv2d")
    gemms = {(p["m"], p["n"], p["k"], p["trans_a"]) for p in wl.problems if p.op == "matmul"}
    assert gemms == {(2, 2, 64, False), (2, 64, 2, False), (64, 2, 2, True)}


def test_autocast_follows_torch_policy():
    x, w = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = OPS.conv2d(x, w, None, [1, 1], [1, 1])
        ref = F.conv2d(x, w, None, 1, 1)
        z = OPS.layer_norm(y.reshape(2, -1))
        want_z = F.layer_norm(y.reshape(2, -1), (288,))
        r = OPS.relu(y)
    assert y.dtype == ref.dtype == torch.bfloat16 and torch.equal(y, ref)
    # CPU autocast has no float32 entry for layer_norm (CUDA's has: tests/gpu)
    assert z.dtype == want_z.dtype == torch.bfloat16 and r.dtype == torch.bfloat16
    # the transposed convolution and attention are lower-precision ops, as torch's are
    q = torch.randn(1, 2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = OPS.conv_transpose2d(x, torch.randn(4, 3, 2, 2), None, [2, 2])
        a, lse = OPS.attention(q, q, q)
        want_t = F.conv_transpose2d(x, torch.randn(4, 3, 2, 2), None, 2)
    assert t.dtype == want_t.dtype == torch.bfloat16
    assert a.dtype == torch.bfloat16 and lse.dtype == torch.float32


def test_backward_mode_mapping_per_pass():
    x, w = torch.randn(2, 4, 8, 8, requires_grad=True), torch.randn(6, 4, 3, 3,
                                                                   requires_grad=True)
    handle = dt.plan_handle(None, {"*": "dnnctl", "conv2d/wgrad": "torch"})
    assert dt.plan_handle(None, {"conv2d/wgrad": "torch", "*": "dnnctl"}) == handle
    grad_plan.BACKWARD_PATHS.clear()
    y = OPS.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "none", None, handle)
    OPS.relu(y, handle).sum().backward()
    assert grad_plan.paths_summary() == {"activation/backward": {"dnnctl": 1, "torch": 0},
                                         "conv2d/dgrad": {"dnnctl": 1, "torch": 0},
                                         "conv2d/wgrad": {"dnnctl": 0, "torch": 1}}
    with pytest.raises(UsageError, match="cudnn"):
        dt.plan_handle(None, {"conv2d": "cudnn"})


def _vendor_conv_variants(monkeypatch):
    """Vendor copies of the numpy conv2d forward / dgrad / wgrad variants, registered for
    one test (the CPU has no vendor conv: cuDNN's are CUDA variants)."""
    from dnnctl.ops import registry

    table = registry._VARIANTS[("conv2d", "numpy")]
    for own in ("im2col_gemm", "dgrad_im2col_gemm", "wgrad_im2col_gemm"):
        cls = type(f"Vendor_{own}", (type(table[own]),),
                   {"name": own + "_vendor", "vendor": True, "__module__": __name__})
        monkeypatch.setitem(table, own + "_vendor", cls())


def _trains(x, w, handle):
    keyfn = lambda xm, wm: dt_keys.conv2d(xm, wm, False, (1, 1), (1, 1), (1, 1), 1,  # noqa: E731
                                          "none", False, False)
    return grad_plan.torch_trains(
        "conv2d", handle, x, w, (x.shape, w.shape, id(handle)), keyfn,
        lambda xm, wm: og.conv2d_keys(xm, wm, False, (1, 1), (1, 1), (1, 1), 1, True, True))


from dnnctl.torch import keys as dt_keys  # noqa: E402


def test_torch_trains_a_conv_only_when_forward_and_every_gradient_pick_torchs_library(
        monkeypatch):
    """A product with nothing fused goes to torch whole under autograd (forward, dgrad,
    wgrad) only where dnnctl would hand each of them to the vendor library torch calls:
    one gradient planned on dnnctl's own kernel keeps the dnnctl op; mode "torch" asks the
    forward only; an autocast region decides on the autocast dtype's keys."""
    from dnnctl.ops import registry

    _vendor_conv_variants(monkeypatch)
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    keyfn = lambda t, u: dt_keys.conv2d(t, u, False, (1, 1), (1, 1), (1, 1), 1,  # noqa: E731
                                        "none", False, False)
    grads = og.conv2d_keys(x, w, False, (1, 1), (1, 1), (1, 1), 1, True, True)

    def plan(fwd, dgrad, wgrad, tensors=(x, w)):
        ks = og.conv2d_keys(*tensors, False, (1, 1), (1, 1), (1, 1), 1, True, True)
        items = [("conv2d", keyfn(*tensors), fwd), (*ks["dgrad"], dgrad),
                 (*ks["wgrad"], wgrad)]
        table = registry._VARIANTS[("conv2d", "numpy")]
        entries = []
        for op, k, v in items:
            problem = problem_of(get_op(op), grad_plan.hashable(k))
            entries.append(entry(problem, v, table[v].default_params(
                problem, get_backend("numpy").device(0))))
        return LoadedPlan(Plan([numpy_section(entries)]))

    assert grads["dgrad"][1]["pass"] == "dgrad"
    vendor = plan("im2col_gemm_vendor", "dgrad_im2col_gemm_vendor", "wgrad_im2col_gemm_vendor")
    assert _trains(x, w, kernels.plan_handle(vendor)) is True
    assert _trains(x, w, kernels.plan_handle(vendor, "dnnctl")) is True
    own_dgrad = plan("im2col_gemm_vendor", "dgrad_im2col_gemm", "wgrad_im2col_gemm_vendor")
    assert _trains(x, w, kernels.plan_handle(own_dgrad)) is False
    assert _trains(x, w, kernels.plan_handle(own_dgrad, "torch")) is True
    own_fwd = plan("im2col_gemm", "dgrad_im2col_gemm_vendor", "wgrad_im2col_gemm_vendor")
    assert _trains(x, w, kernels.plan_handle(own_fwd, "torch")) is False
    # no plan: the default heuristic picks dnnctl's own numpy kernels
    assert _trains(x, w, kernels.plan_handle(None, "dnnctl")) is False
    # under CPU autocast the call runs in bfloat16: the float32 entries do not apply
    low = plan("im2col_gemm_vendor", "dgrad_im2col_gemm_vendor", "wgrad_im2col_gemm_vendor",
               (x.bfloat16(), w.bfloat16()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert grad_plan.low_dtype(x) is torch.bfloat16
        assert _trains(x, w, kernels.plan_handle(low)) is True
        assert _trains(x, w, kernels.plan_handle(vendor)) is False
    assert _trains(x, w, kernels.plan_handle(low)) is False
    assert grad_plan.low_dtype(x.double()) is torch.float64
