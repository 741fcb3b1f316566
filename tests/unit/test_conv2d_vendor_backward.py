"""conv2d's cuDNN backward candidates (dgrad_torch_cudnn / wgrad_torch_cudnn): flags, support
reasons and the argument plumbing. The kernels call aten::convolution_backward, which torch
also runs on CPU tensors, so their layout permutes, groups, strides, dilations and the bias
gradient are checked here against the float64 reference (cuDNN on the GPU:
tests/gpu/test_conv_backward.py runs every backward variant)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnctl.ops  # noqa: F401 - registers the ops
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.conv2d import vendor_backward
from dnnctl.ops.registry import get_op, get_variant, use_deterministic, variants

torch = pytest.importorskip("torch")

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)
SHAPES = [
    dict(n=2, c=8, h=9, w=7, k=12, r=3, s=3, pad=1),
    dict(n=1, c=6, h=11, w=10, k=8, r=3, s=3, stride=2, pad=1),
    dict(n=2, c=8, h=9, w=9, k=4, r=3, s=3, dilation=2, pad=2, groups=2),
    dict(n=2, c=6, h=8, w=8, k=6, r=3, s=3, pad=1, groups=6),
    dict(n=2, c=3, h=16, w=16, k=5, r=4, s=4, stride=4),
]


def _problem(shape: dict, which: str, layout: str, bias: bool = False):
    return OP.problem(dict(shape, dtype="float32", layout=layout, tf32=False, bias=bias,
                           **{"pass": which}))


@pytest.mark.parametrize("which", ["dgrad", "wgrad"])
def test_flags_and_support(which, monkeypatch):
    v = get_variant("conv2d", "cupy", f"{which}_torch_cudnn")
    assert v.vendor and not v.deterministic and v.passes == (which,)
    p = _problem(SHAPES[0], which, "NHWC")
    assert v.workspace_bytes(p, {}) == 0
    monkeypatch.setattr(vendor_backward, "torch_cuda_missing", lambda: None)
    assert v.supports(p, H200)
    asym = OP.problem(dict(SHAPES[0], pad=(0, 1, 0, 1), dtype="float16", layout="NHWC",
                           **{"pass": which}))
    ans = v.supports(asym, H200)
    assert not ans and "asymmetric padding" in ans.reason
    # un-tuned, this fp32 3x3 gradient takes cuDNN; --deterministic leaves cuDNN out
    assert OP.default_choice(p, "cupy", H200).variant == v.name
    assert OP.default_choice(asym, "cupy", H200).variant != v.name
    with use_deterministic():
        assert v.name not in {x.name for x in variants("conv2d", "cupy")}
        assert OP.default_choice(p, "cupy", H200).variant != v.name


@pytest.mark.parametrize(("which", "change", "cudnn"), [
    ("wgrad", {}, True),
    ("wgrad", {"dtype": "float16", "layout": "NHWC"}, True),
    ("wgrad", {"r": 1, "s": 1, "pad": 0}, True),
    ("dgrad", {}, True),  # fp32 NCHW 3x3
    ("dgrad", {"layout": "NHWC"}, True),  # fp32 NHWC
    ("dgrad", {"dtype": "float16"}, True),  # 16-bit NCHW
    ("dgrad", {"dtype": "float16", "layout": "NHWC"}, True),
    ("dgrad", {"dtype": "bfloat16", "layout": "NHWC", "stride": 2}, True),
    ("dgrad", {"r": 1, "s": 1, "pad": 0}, False),  # a 1x1: one GEMM of ours
    ("dgrad", {"r": 1, "s": 1, "pad": 0, "dtype": "float16", "layout": "NHWC"}, False),
    ("dgrad", {"r": 1, "s": 1, "pad": 0, "stride": 2}, True),  # strided 1x1: cuDNN
    ("dgrad", {"groups": 64, "k": 64}, False),  # depthwise: ours
    ("wgrad", {"groups": 64, "k": 64}, False),
])
def test_untuned_gradient_route(which, change, cudnn, monkeypatch):
    """A dense layer's gradients default to cuDNN, except the data gradient of a 1x1
    stride-1 unpadded layer; depthwise layers keep our kernels; the numpy backend never
    takes cuDNN."""
    monkeypatch.setattr(vendor_backward, "torch_cuda_missing", lambda: None)
    key = dict(n=8, c=64, h=28, w=28, k=128, r=3, s=3, pad=1, dtype="float32",
               layout="NCHW", tf32=True, **{"pass": which})
    p = OP.problem({**key, **change})
    got = OP.default_choice(p, "cupy", H200).variant
    assert (got == f"{which}_torch_cudnn") is cudnn, got
    assert OP.default_choice(p, "numpy", H200).variant != f"{which}_torch_cudnn"


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("which", ["dgrad", "wgrad"])
def test_kernel_matches_the_reference_on_torch_cpu_tensors(which, shape, layout):
    bias = which == "wgrad"
    p = _problem(shape, which, layout, bias)
    inputs = OP.make_inputs(p, np.random.default_rng(1))
    ref = OP.reference(p, inputs, OP.default_attrs(p))
    kern = get_variant("conv2d", "cupy", f"{which}_torch_cudnn").build(p, {}, None)
    got = kern({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()}, {},
               OP.default_attrs(p))
    assert set(got) == set(ref)
    for name, want in ref.items():
        out = got[name].numpy()
        assert out.shape == want.shape, name
        assert rel_norm_error(out, want) < 1e-5, name


def test_outputs_passed_in_are_written():
    p = _problem(SHAPES[1], "dgrad", "NHWC")
    inputs = OP.make_inputs(p, np.random.default_rng(2))
    want = OP.reference(p, inputs, OP.default_attrs(p))["dx"]
    dx = torch.full(want.shape, float("nan"))
    kern = get_variant("conv2d", "cupy", "dgrad_torch_cudnn").build(p, {}, None)
    made = kern({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()},
                {"dx": dx}, OP.default_attrs(p))
    assert made == {}
    assert rel_norm_error(dx.numpy(), want) < 1e-5
