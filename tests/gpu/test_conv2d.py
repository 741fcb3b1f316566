"""conv2d on the GPU: every registered cupy variant (whoever wrote it) x dtype x layout against
the float64 reference on fresh random inputs with NaN-poisoned outputs, over edge shapes
(N=1, C/K not multiples of 8, odd H/W, stride 2, dilation 2, asymmetric padding, groups 1 / 2
/ C, 1x1, 7x7, every epilogue), each case as a problem of every pass the variant computes
(forward, dgrad, wgrad with db); then the public API on CuPy arrays and on torch CUDA tensors
(zero-copy DLPack, channels_last, a misaligned view) cross-checked against
torch.nn.functional.conv2d.

Compile cost bounds the run: each case checks the variant's default parameters, and every
other case one more parameter set drawn (seeded) from the variant's space.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.check import check_variant
from dnnctl.ops.conv2d.op import default_params, geometry, own_choice
from dnnctl.ops.registry import get_op, variants

OP = get_op("conv2d")

CASES: list[tuple[str, dict]] = [
    ("3x3", dict(n=2, c=16, h=10, w=12, k=24, r=3, s=3, pad=1)),
    ("n1_odd_ck", dict(n=1, c=13, h=9, w=11, k=10, r=3, s=3, pad=1, bias=True,
                       activation="relu")),
    ("s2_asym_pad", dict(n=2, c=24, h=15, w=13, k=40, r=3, s=3, stride=2, pad=[1, 0, 0, 1],
                         residual=True)),
    ("dilation2", dict(n=2, c=16, h=14, w=13, k=16, r=3, s=3, dilation=2, pad=2, bias=True,
                       activation="gelu")),
    ("groups2", dict(n=2, c=32, h=9, w=9, k=48, r=3, s=3, pad=1, groups=2, bias=True,
                     activation="silu", residual=True)),
    ("depthwise", dict(n=2, c=32, h=17, w=15, k=32, r=3, s=3, pad=1, groups=32, bias=True,
                       activation="relu")),
    ("depthwise_5x5_s2_mult2", dict(n=1, c=24, h=14, w=15, k=48, r=5, s=5, stride=2, pad=2,
                                    groups=24, residual=True)),
    ("1x1", dict(n=2, c=64, h=7, w=9, k=72, r=1, s=1, bias=True, residual=True,
                 activation="relu")),
    ("1x1_s2_odd", dict(n=1, c=40, h=13, w=13, k=20, r=1, s=1, stride=2)),
    ("7x7_s2_c3", dict(n=1, c=3, h=33, w=31, k=16, r=7, s=7, stride=2, pad=3, bias=True)),
    ("resnet_like", dict(n=4, c=64, h=28, w=28, k=64, r=3, s=3, pad=1, bias=True,
                         activation="relu")),
    ("5x5_pad_asym_tf32", dict(n=2, c=8, h=12, w=11, k=12, r=5, s=5, pad=[2, 1, 0, 3],
                               tf32=True)),
    ("mbv2_dw_relu6", dict(n=2, c=96, h=28, w=28, k=96, r=3, s=3, stride=2, pad=1, groups=96,
                           bias=True, activation="relu6")),
    ("mbv3_1x1_hardswish", dict(n=2, c=40, h=14, w=14, k=240, r=1, s=1, bias=True,
                                activation="hardswish")),
    ("3x3_relu6_residual", dict(n=2, c=32, h=10, w=10, k=32, r=3, s=3, pad=1, bias=True,
                                activation="relu6", residual=True)),
    ("convnext_dw_7x7", dict(n=2, c=96, h=28, w=27, k=96, r=7, s=7, pad=3, groups=96,
                             bias=True, residual=True)),
    ("effnet_dw_5x5_s2", dict(n=2, c=40, h=29, w=30, k=40, r=5, s=5, stride=2, pad=2,
                              groups=40, bias=True, activation="silu")),
    # a ResNet block's end, relu(bn(conv(x)) + identity): the residual before the activation
    ("1x1_residual_before_relu", dict(n=2, c=64, h=7, w=9, k=72, r=1, s=1, bias=True,
                                      residual=True, activation="relu",
                                      residual_before_act=True)),
    ("3x3_s2_residual_before_silu", dict(n=2, c=24, h=15, w=13, k=40, r=3, s=3, stride=2,
                                         pad=1, bias=True, residual=True, activation="silu",
                                         residual_before_act=True)),
]
DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("NCHW", "NHWC")


def _variant_names() -> list[str]:
    return [v.name for v in variants("conv2d", "cupy")]


def pass_case(case: dict, which: str) -> dict:
    """A forward case as a problem of pass ``which``: no epilogue; bias means db (wgrad)."""
    if which == "forward":
        return dict(case)
    key = {k: v for k, v in case.items() if k not in ("activation", "residual", "bias")}
    return dict(key, bias=which == "wgrad", **{"pass": which})


@pytest.fixture(scope="module")
def gpu():
    be = get_backend("cupy")
    return be, be.device(0)


def _params_to_check(variant, problem, dev, rng, extra: bool) -> list[dict]:
    out = []
    first = default_params(variant, problem, dev)
    if first is not None:
        out.append(first)
    if extra:
        space = list(variant.param_space(problem, dev))
        if space:
            pick = rng.choice(space)
            if pick not in out:
                out.append(pick)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _variant_names())
def test_variant_matches_reference(name, dtype, layout, gpu):
    be, dev = gpu
    variant = next(v for v in variants("conv2d", "cupy") if v.name == name)
    rng = random.Random(f"{name}/{dtype}/{layout}")
    checked, failures = 0, []
    for i, (cid, case) in enumerate(CASES):
        if case.get("tf32") and dtype != "float32":
            continue
        for which in variant.passes:
            problem = OP.problem(dict(pass_case(case, which), dtype=dtype, layout=layout))
            if not variant.supports(problem, dev):
                continue
            params_list = _params_to_check(variant, problem, dev, rng, extra=i % 2 == 0)
            assert params_list, f"{name} supports {cid} but has no valid parameters"
            for params in params_list:
                assert variant.check_params(params) is None
                res = check_variant(OP, problem, variant, params, be, dev, seed=1000 + i)
                checked += 1
                if not res.ok:
                    failures.append(f"{cid} {which} {params}: {res.detail}")
    if checked == 0:
        pytest.skip(f"{name} supports none of the cases for {dtype} {layout}")
    assert not failures, f"{name} {dtype} {layout}:\n" + "\n".join(failures)


def test_every_case_is_covered_by_some_variant(gpu):
    """The registry as a whole handles every edge shape (direct is the universal fallback)."""
    _, dev = gpu
    for cid, case in CASES:
        for dtype in DTYPES:
            for layout in LAYOUTS:
                for which in ("forward", "dgrad", "wgrad"):
                    problem = OP.problem(dict(pass_case(case, which), dtype=dtype,
                                              layout=layout))
                    assert any(v.supports(problem, dev)
                               for v in variants("conv2d", "cupy")), (cid, which)


# ----------------------------------------------------------------------------- public API


def _torch_reference(torch, x, w, b, res, stride, padding4, dilation, groups, act):
    """float64 torch conv with asymmetric padding done by F.pad, then the epilogue."""
    f = torch.nn.functional
    top, bottom, left, right = padding4
    xd = f.pad(x.double(), (left, right, top, bottom))
    y = f.conv2d(xd, w.double(), None if b is None else b.double(), stride=stride,
                 dilation=dilation, groups=groups)
    y = {"none": y, "relu": f.relu(y), "gelu": f.gelu(y), "silu": f.silu(y)}[act]
    return y if res is None else y + res.double()


@pytest.mark.parametrize(("dtype", "layout", "shape"), [
    ("float16", "NHWC", dict(n=2, c=64, h=14, w=14, k=64, r=3, s=3, stride=1, pad=(1, 1, 1, 1),
                             groups=1, act="relu")),
    ("bfloat16", "NHWC", dict(n=1, c=96, h=15, w=13, k=96, r=3, s=3, stride=2,
                              pad=(1, 0, 1, 0), groups=96, act="silu")),
    ("float32", "NCHW", dict(n=2, c=24, h=11, w=9, k=40, r=1, s=1, stride=1, pad=(0, 0, 0, 0),
                             groups=1, act="gelu")),
    ("float32", "NCHW", dict(n=1, c=32, h=16, w=16, k=32, r=5, s=5, stride=1, pad=(2, 2, 2, 2),
                             groups=2, act="none")),
])
def test_public_api_matches_torch(dtype, layout, shape, gpu):
    torch = pytest.importorskip("torch")
    import dnnctl.ops

    tdt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    n, c, h, w_, k = shape["n"], shape["c"], shape["h"], shape["w"], shape["k"]
    r, s, groups = shape["r"], shape["s"], shape["groups"]
    x = torch.randn(n, c, h, w_, device=dev, generator=gen).to(tdt)
    wt = (torch.randn(k, c // groups, r, s, device=dev, generator=gen)
          / math.sqrt(c // groups * r * s)).to(tdt)
    b = torch.randn(k, device=dev, generator=gen).to(tdt)
    ref = _torch_reference(torch, x, wt, b, None, shape["stride"], shape["pad"], 1, groups,
                           shape["act"])
    res = torch.randn(ref.shape, device=dev, generator=gen).to(tdt)
    ref = ref + res.double()
    if layout == "NHWC":  # channels_last tensors, viewed as (N, H, W, C): zero-copy
        xa = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        wa = wt.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        ra = res.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    else:
        xa, wa, ra = x, wt, res
    act = None if shape["act"] == "none" else shape["act"]
    y = dnnctl.ops.conv2d(xa, wa, bias=b, stride=shape["stride"], padding=shape["pad"],
                          groups=groups, activation=act, residual=ra, layout=layout)
    assert isinstance(y, torch.Tensor) and y.device == x.device and y.dtype == tdt
    got = y.permute(0, 3, 1, 2) if layout == "NHWC" else y
    assert tuple(got.shape) == tuple(ref.shape)
    key = dict(n=n, c=c, h=h, w=w_, k=k, r=r, s=s, dtype=dtype, layout=layout)
    tol = OP.tolerance(OP.problem(key), "y")
    err = rel_norm_error(got.double().cpu().numpy(), ref.cpu().numpy())
    assert err <= tol, f"rel err {err:.3g} > {tol}"


def test_public_api_misaligned_dlpack_view(gpu):
    """A torch view one element into its storage is not 16-byte aligned: vectorized NHWC
    kernels must notice and still be right."""
    torch = pytest.importorskip("torch")
    import dnnctl.ops

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(3)
    n, h, w_, c = 2, 9, 10, 64
    storage = torch.randn(n * h * w_ * c + 1, device=dev, generator=gen).half()
    x = storage[1:].view(n, h, w_, c)
    assert x.data_ptr() % 16 != 0
    wt = (torch.randn(c, 3, 3, 1, device=dev, generator=gen) / 3).half()
    y = dnnctl.ops.conv2d(x, wt, padding=1, groups=c, layout="NHWC")
    ref = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).double(),
                                     wt.permute(0, 3, 1, 2).double(), padding=1, groups=c)
    err = rel_norm_error(y.permute(0, 3, 1, 2).double().cpu().numpy(), ref.cpu().numpy())
    assert err <= 2e-3, err


@pytest.mark.parametrize("dtype", DTYPES)
def test_public_api_on_cupy_arrays_default_heuristic(dtype, gpu):
    import cupy as cp

    import dnnctl.ops

    be, dev = gpu
    problem = OP.problem(n=2, c=32, h=20, w=20, k=64, r=3, s=3, pad=1, dtype=dtype,
                         layout="NHWC", bias=True, activation="relu")
    choice = OP.default_choice(problem, "cupy", dev)
    assert next(v for v in variants("conv2d", "cupy") if v.name == choice.variant).supports(
        problem, dev)
    host = OP.make_inputs(problem, np.random.default_rng(5))
    ref = OP.reference(problem, {k: v.astype(np.float64) for k, v in host.items()}, {})["y"]
    x, w, b = (cp.asarray(host[k]) for k in ("x", "w", "bias"))
    y = dnnctl.ops.conv2d(x, w, bias=b, padding=1, activation="relu", layout="NHWC")
    assert isinstance(y, cp.ndarray) and y.shape == ref.shape
    g = geometry(problem)
    assert y.dtype == host["x"].dtype and g.p == 20
    assert rel_norm_error(cp.asnumpy(y), ref) <= OP.tolerance(problem, "y")


@pytest.mark.parametrize(("dtype", "layout", "tf32", "shape", "expect"), [
    ("float32", "NCHW", True, dict(n=8, c=64, h=28, w=28, k=128, r=3, s=3, stride=1, pad=1,
                                   groups=1, act="relu", res=True), "nhwc_implicit_gemm"),
    # the ResNet stem (3 channels, 7x7 / 2): im2col's cuBLAS GEMM would read filter rows of
    # 147 halves, not 16-byte aligned (cuBLAS's narrow fallback, 1390 us at batch 32 NHWC)
    ("float16", "NCHW", False, dict(n=8, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3,
                                    groups=1, act="silu", res=False), "implicit_gemm"),
    ("float32", "NCHW", False, dict(n=4, c=144, h=14, w=15, k=144, r=3, s=3, stride=1, pad=1,
                                    groups=144, act="relu", res=True), "depthwise_planes"),
])
def test_default_heuristic_paths_match_torch(dtype, layout, tf32, shape, expect, gpu):
    """Our own heuristic takes the cost model's picks (dnnctl/ops/conv2d/cost.py;
    test_costmodel.py checks them without a GPU) and agrees with torch, planned or not (the
    un-tuned call of a dense one runs cuDNN's convolution + our epilogue)."""
    torch = pytest.importorskip("torch")
    import dnnctl.ops

    _, dev = gpu
    n, c, h, w_, k = shape["n"], shape["c"], shape["h"], shape["w"], shape["k"]
    r, s, groups, st, pad = shape["r"], shape["s"], shape["groups"], shape["stride"], shape["pad"]
    key = dict(n=n, c=c, h=h, w=w_, k=k, r=r, s=s, stride=st, pad=pad, groups=groups,
               dtype=dtype, layout=layout, bias=True, activation=shape["act"],
               residual=shape["res"], tf32=tf32)
    problem = OP.problem(key)
    own = own_choice(problem, "cupy", dev)
    assert own.variant == expect
    default = OP.default_choice(problem, "cupy", dev)
    if groups == c:  # depthwise: our own kernels
        assert default == own
    else:  # a dense conv with an epilogue: cuDNN's convolution + our one-pass epilogue
        assert (default.variant, default.param_dict) == ("torch_cudnn", {"fuse": 0})
    tdt = getattr(torch, dtype)
    tdev = torch.device("cuda")
    gen = torch.Generator(device=tdev).manual_seed(11)
    x = torch.randn(n, c, h, w_, device=tdev, generator=gen).to(tdt)
    wt = (torch.randn(k, c // groups, r, s, device=tdev, generator=gen)
          / math.sqrt(c // groups * r * s)).to(tdt)
    b = torch.randn(k, device=tdev, generator=gen).to(tdt)
    ref = _torch_reference(torch, x, wt, b, None, st, (pad,) * 4, 1, groups, shape["act"])
    res = torch.randn(ref.shape, device=tdev, generator=gen).to(tdt) if shape["res"] else None
    if res is not None:
        ref = ref + res.double()
    for plan in (_plan_with(problem, own, dev), None):  # our pick, then the un-tuned call
        y = dnnctl.ops.conv2d(x, wt, bias=b, stride=st, padding=pad, groups=groups,
                              activation=shape["act"], residual=res, layout=layout, tf32=tf32,
                              plan=plan)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == tuple(ref.shape)
        err = rel_norm_error(y.double().cpu().numpy(), ref.cpu().numpy())
        assert err <= OP.tolerance(problem, "y"), f"{plan and own.variant} rel err {err:.3g}"


def _plan_with(problem, choice, dev):
    """A loaded plan for this GPU holding one entry: ``choice`` for ``problem``."""
    import datetime as dt

    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return LoadedPlan(Plan([Section(dev.fingerprint(), kernels_digest(), now, {},
                                    [PlanEntry(problem, choice)])]))
