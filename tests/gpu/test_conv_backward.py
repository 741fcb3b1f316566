"""conv2d dgrad / wgrad and matmul backward on the GPU, in depth (tests/gpu/test_conv2d.py
runs every backward variant on the small edge shapes too).

* every backward variant x dtype x layout it supports on training-like shapes (ResNet 3x3,
  strided 3x3, 1x1, bottleneck 1x1 stride 2, depthwise, a 16x16 patch embedding, groups 2,
  dilation 2, N=1) against the float64 reference with NaN-poisoned outputs, at its default
  parameters and at a sampled parameter set (split-K wgrad included);
* the deterministic wgrad variants are bitwise repeatable;
* the public functions on torch CUDA tensors (channels_last too) against torch.nn.grad
  (cuDNN), and matmul_backward against torch autograd.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.check import check_variant, prepare
from dnnctl.ops.conv2d.op import default_params
from dnnctl.ops.registry import get_op, variants

OP = get_op("conv2d")

SHAPES: list[tuple[str, dict]] = [
    ("resnet_3x3", dict(n=4, c=64, h=28, w=28, k=64, r=3, s=3, pad=1)),
    ("resnet_3x3_s2", dict(n=2, c=64, h=29, w=27, k=128, r=3, s=3, stride=2, pad=1)),
    ("bottleneck_1x1", dict(n=4, c=256, h=14, w=14, k=64, r=1, s=1)),
    ("downsample_1x1_s2", dict(n=2, c=128, h=15, w=14, k=256, r=1, s=1, stride=2)),
    ("stem_7x7_s2", dict(n=1, c=3, h=45, w=43, k=32, r=7, s=7, stride=2, pad=3)),
    ("patch16", dict(n=2, c=3, h=64, w=64, k=96, r=16, s=16, stride=16)),
    ("depthwise_s2", dict(n=2, c=48, h=17, w=15, k=48, r=3, s=3, stride=2, pad=1, groups=48)),
    ("groups2_dil2_n1", dict(n=1, c=32, h=13, w=11, k=48, r=3, s=3, dilation=2, pad=2,
                             groups=2)),
]
DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("NHWC", "NCHW")


def _backward_names() -> list[str]:
    return [v.name for v in variants("conv2d", "cupy") if set(v.passes) - {"forward"}]


@pytest.fixture(scope="module")
def gpu():
    be = get_backend("cupy")
    return be, be.device(0)


def _problem(shape: dict, which: str, dtype: str, layout: str, tf32: bool = False):
    return OP.problem(dict(shape, dtype=dtype, layout=layout, tf32=tf32,
                           bias=which == "wgrad", **{"pass": which}))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _backward_names())
def test_backward_variant_on_training_shapes(name, dtype, layout, gpu):
    be, dev = gpu
    variant = next(v for v in variants("conv2d", "cupy") if v.name == name)
    rng = random.Random(f"{name}/{dtype}/{layout}")
    checked, failures = 0, []
    for i, (sid, shape) in enumerate(SHAPES):
        for which in variant.passes:
            for tf32 in ((False, True) if dtype == "float32" else (False,)):
                problem = _problem(shape, which, dtype, layout, tf32)
                if not variant.supports(problem, dev):
                    continue
                picks = [default_params(variant, problem, dev)]
                space = list(variant.param_space(problem, dev))
                if space:
                    picks.append(rng.choice(space))
                for params in [p for j, p in enumerate(picks) if p not in picks[:j]]:
                    res = check_variant(OP, problem, variant, params, be, dev, seed=77 + i)
                    checked += 1
                    if not res.ok:
                        failures.append(f"{sid} tf32={tf32} {params}: {res.detail}")
    if checked == 0:
        pytest.skip(f"{name} supports none of the shapes for {dtype} {layout}")
    assert not failures, f"{name} {dtype} {layout}:\n" + "\n".join(failures)


def test_every_backward_shape_has_a_variant(gpu):
    _, dev = gpu
    for sid, shape in SHAPES:
        for which in ("dgrad", "wgrad"):
            for dtype in DTYPES:
                for layout in LAYOUTS:
                    problem = _problem(shape, which, dtype, layout)
                    choice = OP.default_choice(problem, "cupy", dev)
                    assert choice.variant.startswith(which), (sid, choice)


@pytest.mark.parametrize("name", ["wgrad_implicit_gemm", "wgrad_direct", "wgrad_depthwise",
                                  "wgrad_im2col_gemm", "dgrad_implicit_gemm"])
def test_deterministic_variants_repeat_bitwise(name, gpu):
    import cupy as cp

    be, dev = gpu
    variant = next(v for v in variants("conv2d", "cupy") if v.name == name)
    assert variant.deterministic
    shape = SHAPES[6][1] if "depthwise" in name else SHAPES[0][1]
    problem = _problem(shape, name.split("_")[0], "float16", "NHWC")
    params = default_params(variant, problem, dev)
    if name == "wgrad_implicit_gemm":
        assert params["splitk"] > 1  # the split-K path is the one that must be repeatable
    kern = variant.build(problem, params, dev)
    prep = prepare(OP, problem, be, np.random.default_rng(1), with_reference=False)
    outs = []
    for _ in range(3):
        kern(prep.inputs, prep.outputs, {})
        outs.append({k: cp.asnumpy(v).copy() for k, v in prep.outputs.items()})
    for o in outs[1:]:
        for k in o:
            assert np.array_equal(o[k].view(np.uint16), outs[0][k].view(np.uint16)), k


@pytest.mark.parametrize(("dtype", "layout", "shape"), [
    ("float16", "NHWC", (8, 64, 28, 28, 64, 3, 1, 1, 1)),
    ("bfloat16", "NHWC", (4, 64, 29, 29, 128, 3, 2, 1, 1)),
    ("float32", "NCHW", (2, 32, 15, 15, 32, 3, 1, 1, 32)),
    ("float16", "NCHW", (2, 3, 64, 64, 96, 16, 16, 0, 1)),
])
def test_public_backward_matches_cudnn(dtype, layout, shape, gpu):
    torch = pytest.importorskip("torch")
    import dnnctl.ops

    n, c, h, w, k, r, st, pad, g = shape
    tdt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(n, c, h, w, device=dev, generator=gen).to(tdt)
    wt = (torch.randn(k, c // g, r, r, device=dev, generator=gen) / math.sqrt(c // g * r * r)
          ).to(tdt)
    y = torch.nn.functional.conv2d(x, wt, None, st, pad, 1, g)
    dy = torch.randn(y.shape, device=dev, generator=gen).to(tdt)
    x64, w64, dy64 = x.double(), wt.double(), dy.double()
    dx_ref = torch.nn.grad.conv2d_input(x.shape, w64, dy64, st, pad, 1, g)
    dw_ref = torch.nn.grad.conv2d_weight(x64, wt.shape, dy64, st, pad, 1, g)
    db_ref = dy64.sum(dim=(0, 2, 3))

    def view(t):  # NHWC: channels_last storage seen as (N, H, W, C), zero-copy
        return t.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1) \
            if layout == "NHWC" else t

    def back(t):
        return t.permute(0, 3, 1, 2) if layout == "NHWC" else t

    kw = dict(stride=st, padding=pad, groups=g, layout=layout)
    dx = dnnctl.ops.conv2d_backward_data(view(dy), view(wt), tuple(view(x).shape), **kw)
    dw, db = dnnctl.ops.conv2d_backward_weight(view(x), view(dy), tuple(view(wt).shape), **kw)
    assert isinstance(dx, torch.Tensor) and dx.is_cuda and dx.dtype == tdt
    key = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=r, stride=st, pad=pad, groups=g, dtype=dtype,
               layout=layout)
    for got, ref, which in ((back(dx), dx_ref, "dgrad"), (back(dw), dw_ref, "wgrad"),
                            (db, db_ref, "wgrad")):
        tol = OP.tolerance(OP.problem(dict(key, **{"pass": which})), "dx")
        err = rel_norm_error(got.double().cpu().numpy(), ref.cpu().numpy())
        assert err <= tol, f"{which}: rel err {err:.3g} > {tol}"


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_matmul_backward_matches_autograd(activation, dtype, gpu):
    torch = pytest.importorskip("torch")
    import dnnctl.ops

    tdt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(9)
    a = torch.randn(4, 197, 384, device=dev, generator=gen).to(tdt)
    b = (torch.randn(384, 1536, device=dev, generator=gen) / 20).to(tdt)
    bias = torch.randn(1536, device=dev, generator=gen).to(tdt)
    ta, tb, tbias = (t.double().requires_grad_() for t in (a, b, bias))
    pre64 = ta @ tb + tbias
    f = torch.nn.functional
    act = {None: lambda v: v, "relu": f.relu, "gelu": f.gelu, "silu": f.silu}[activation]
    out = act(pre64)
    dy = torch.randn(out.shape, device=dev, generator=gen).to(tdt)
    out.backward(dy.double())
    pre = pre64.detach().to(tdt)
    da, db, dbias = dnnctl.ops.matmul_backward(dy, a, b, pre=pre, activation=activation)
    tol = 5e-3 if dtype == "float16" else 1e-4
    for got, ref in ((da, ta.grad), (db, tb.grad), (dbias, tbias.grad)):
        err = rel_norm_error(got.double().cpu().numpy(), ref.cpu().numpy())
        assert err <= tol, err
