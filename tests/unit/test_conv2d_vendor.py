"""conv2d's cuDNN vendor variant (torch_cudnn) and the default policy around it, the
vectorized stand-alone epilogue's width, and the cost model's unaligned-cuBLAS class, without
a GPU (tests/gpu/test_conv2d.py runs the variant on every case, dtype and layout)."""

from __future__ import annotations

import pytest

import dnnctl.ops  # noqa: F401 - registers the ops
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.conv2d import vendor
from dnnctl.ops.conv2d.cuda_base import epilogue_vec
from dnnctl.ops.conv2d.op import geometry as geom
from dnnctl.ops.conv2d.op import own_choice, ranked
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)
OP = get_op("conv2d")
VENDOR = get_variant("conv2d", "cupy", "torch_cudnn")
STEM = dict(n=32, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3, dtype="float16",
            layout="NHWC", bias=True, activation="relu")


def test_vendor_is_flagged_and_never_bitwise_promised():
    assert VENDOR.vendor and not VENDOR.deterministic
    assert VENDOR.workspace_bytes(OP.problem(STEM), {"fuse": 0}) == 0


def test_without_cuda_torch_it_says_why_and_the_default_is_our_own():
    why = vendor.torch_cuda_missing()
    if why is None:
        pytest.skip("this machine has torch with CUDA")
    p = OP.problem(STEM)
    ans = VENDOR.supports(p, H200)
    assert not ans and ans.reason == why
    assert OP.default_choice(p, "cupy", H200) == own_choice(p, "cupy", H200)


DEPTHWISE = {"c": 64, "k": 64, "groups": 64, "h": 56, "w": 56, "r": 3, "s": 3, "stride": 1,
             "pad": 1}
ONE_BY_ONE = {"dtype": "float32", "layout": "NCHW", "r": 1, "s": 1, "stride": 1, "pad": 0}


@pytest.mark.parametrize(("change", "route"), [
    ({}, "relu"),  # fp16 NHWC conv + bias + ReLU: cuDNN (its fused graph on this stem)
    ({"bias": False}, "relu"),
    ({"dtype": "bfloat16"}, "relu"),
    ({"residual": True}, "epilogue"),  # + residual after ReLU: cuDNN's conv + our pass
    ({"activation": "gelu"}, "epilogue"),
    ({"activation": "none"}, "epilogue"),  # a bias alone
    ({"layout": "NCHW"}, "epilogue"),
    ({"dtype": "float32"}, "epilogue"),
    (DEPTHWISE, "own"),  # depthwise: our kernels
    # a TF32 NCHW 1x1 GEMM with an epilogue: our gemm_1x1 fuses it (cuDNN's route is two
    # passes); without TF32, or plain (nothing fused), cuDNN's
    ({**ONE_BY_ONE, "tf32": True}, "own"),
    ({**ONE_BY_ONE, "tf32": False}, "epilogue"),
    ({**DEPTHWISE, "dtype": "float32", "layout": "NCHW"}, "own"),
])
def test_default_route_of_a_fused_conv(change, route, monkeypatch):
    """The policy alone (no GPU here): where the probe says torch has CUDA, an un-tuned
    fp16 / bf16 NHWC conv + ReLU runs cuDNN's fused graph (or its convolution + our pass),
    every other dense conv cuDNN's convolution + our one-pass epilogue, a depthwise conv our
    own kernels; the backward passes and the numpy backend keep our own choice."""
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    monkeypatch.setattr(vendor, "_has_fused_relu", lambda: True)
    p = OP.problem(dict(STEM, **change))
    choice = OP.default_choice(p, "cupy", H200)
    if route == "relu":
        assert choice.variant == "torch_cudnn"
    elif route == "epilogue":
        assert (choice.variant, choice.param_dict) == ("torch_cudnn", {"fuse": 0})
    else:
        assert choice == own_choice(p, "cupy", H200)
    assert own_choice(p, "cupy", H200).variant != "torch_cudnn"
    assert OP.default_choice(p, "numpy", H200).variant != "torch_cudnn"
    back = OP.problem({**STEM, **change, "pass": "dgrad", "bias": False, "activation": "none",
                       "residual": False})
    assert OP.default_choice(back, "cupy", H200).variant != "dgrad_torch_cudnn"


@pytest.mark.parametrize(("n", "fused"), [(1, False), (32, False), (256, True)])
def test_fused_graph_only_where_the_call_hides_its_host_time(n, fused, monkeypatch):
    """ResNet's 3x3 64->64 layer at 56x56: cuDNN's fused graph costs ~64 us of host time per
    call against ~30 for cuDNN's convolution + our epilogue; it is the default only where
    the convolution's own GPU time is longer than that (batch 256), not on the short calls
    of small batches, where an eager caller would wait on the host."""
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    monkeypatch.setattr(vendor, "_has_fused_relu", lambda: True)
    p = OP.problem(dict(STEM, n=n, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1))
    choice = OP.default_choice(p, "cupy", H200)
    assert (choice.variant, choice.param_dict) == ("torch_cudnn", {"fuse": int(fused)})


def test_backward_default_keeps_our_kernels(monkeypatch):
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    dgrad = OP.problem(dict(STEM, bias=False, activation="none", **{"pass": "dgrad"}))
    assert OP.default_choice(dgrad, "cupy", H200).variant.startswith("dgrad")


@pytest.mark.parametrize(("key", "fuse_ok"), [
    (dict(activation="relu"), True),
    (dict(activation="relu", residual=True), False),  # dnnctl adds the residual after ReLU
    (dict(activation="gelu"), False),
    (dict(activation="none"), False),
])
def test_fused_cudnn_relu_only_where_its_order_is_ours(key, fuse_ok, monkeypatch):
    monkeypatch.setattr(vendor, "_has_fused_relu", lambda: True)
    p = OP.problem(dict(STEM, **key))
    assert VENDOR.valid_params(p, {"fuse": 1}, H200) is fuse_ok
    assert VENDOR.valid_params(p, {"fuse": 0}, H200)


@pytest.mark.parametrize(("key", "vec"), [
    (dict(dtype="float16", layout="NHWC", k=64), 8),   # 8 channels per 16-byte access
    (dict(dtype="float16", layout="NHWC", k=12), 4),   # never across a pixel's channels
    (dict(dtype="float32", layout="NHWC", k=64), 4),
    (dict(dtype="bfloat16", layout="NHWC", k=3), 1),
    (dict(dtype="float16", layout="NCHW", k=3), 8),    # P*Q = 112*112 pixels of a channel
    (dict(dtype="float16", layout="NCHW", k=64, h=7, w=7, r=1, s=1, stride=1, pad=0), 1),
])
def test_epilogue_vector_width(key, vec):
    assert epilogue_vec(geom(OP.problem(dict(STEM, **key)))) == vec


def test_unaligned_cublas_rows_are_costed_as_the_fallback_they_run():
    """fp16 NHWC im2col_gemm on the stem: patch rows of 147 halves (294 bytes) are not
    16-byte aligned, so cuBLAS runs narrow kernels (measured 1390 us at batch 32); the model
    must rank it below the implicit GEMMs there, and not penalize aligned rows."""
    stem = {e.variant: e for e in reversed(ranked(OP.problem(STEM), "cupy", H200))}
    assert "cublas_unaligned" in stem["im2col_gemm"].notes
    assert stem["im2col_gemm"].us > 5 * stem["implicit_gemm"].us
    assert own_choice(OP.problem(STEM), "cupy", H200).variant != "im2col_gemm"
    aligned = dict(STEM, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1)
    est = {e.variant: e for e in reversed(ranked(OP.problem(aligned), "cupy", H200))}
    assert "cublas_fp16" in est["im2col_gemm"].notes


@pytest.mark.parametrize(("change", "fused"), [
    ({}, True),  # conv + bias + ReLU: cudnn_convolution_relu
    ({"residual": True, "residual_before_act": True}, True),  # cudnn_convolution_add_relu
    ({"residual": True}, False),  # + residual after the ReLU: no cuDNN graph for it
    ({"activation": "gelu"}, False),
    ({"activation": "none", "residual": True}, False),
])
def test_cudnn_fused_graphs_cover_a_resnet_blocks_end(change, fused, monkeypatch):
    """fuse=1 is cuDNN's conv + bias + ReLU graph, and for relu(conv + bias + residual) (a
    ResNet block's end) its conv + add + ReLU graph; other epilogues keep fuse=0."""
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    monkeypatch.setattr(vendor, "_has_fused_relu", lambda: True)
    monkeypatch.setattr(vendor, "_has_fused_add_relu", lambda: True)
    p = OP.problem(dict(STEM, **change))
    assert VENDOR.valid_params(p, {"fuse": 1}, H200) is fused
    assert VENDOR.default_params(p, H200) == {"fuse": int(fused)}
    assert VENDOR.valid_params(p, {"fuse": 0}, H200)


@pytest.mark.parametrize(("n", "cudnn"), [(1, False), (256, True)])
def test_a_resnet_blocks_end_takes_cudnns_add_relu_graph_where_its_host_time_hides(n, cudnn,
                                                                                  monkeypatch):
    """relu(conv + bias + residual), ResNet-50's last 1x1 of a stage-1 block: cuDNN's conv +
    add + ReLU graph at batch 256, whose GPU time hides the graph's host time; our own
    kernels at batch 1 (never cuDNN's convolution + a separate pass for it)."""
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    monkeypatch.setattr(vendor, "_has_fused_add_relu", lambda: True)
    p = OP.problem(dict(STEM, n=n, c=64, h=56, w=56, k=256, r=1, s=1, stride=1, pad=0,
                        residual=True, residual_before_act=True))
    choice = OP.default_choice(p, "cupy", H200)
    if cudnn:
        assert (choice.variant, choice.param_dict) == ("torch_cudnn", {"fuse": 1})
    else:
        assert choice == own_choice(p, "cupy", H200)


@pytest.mark.parametrize("change", [
    {},  # fp16 NHWC
    {"dtype": "bfloat16"},
    {"dtype": "float32", "layout": "NCHW"},
    {"r": 1, "s": 1, "stride": 2, "pad": 0},
    {"c": 64, "k": 64, "groups": 64},  # depthwise
    {"c": 64, "k": 128, "groups": 2},
])
def test_a_dense_conv_with_nothing_fused_or_a_bias_defaults_to_cudnn(change, monkeypatch):
    """Every conv of a model in training mode (BatchNorm not folded) has no bias, activation
    or residual: un-tuned, a dense one runs cuDNN's convolution alone (fuse=0) in any dtype
    and layout, and with a bias cuDNN's convolution + our pass; a depthwise one (with or
    without a bias) our own kernels."""
    monkeypatch.setattr(vendor, "torch_cuda_missing", lambda: None)
    plain = dict(STEM, c=64, h=56, w=56, k=128, r=3, s=3, stride=1, pad=1, bias=False,
                 activation="none")
    depthwise = change.get("groups", 1) == change.get("c")
    for bias in (False, True):
        p = OP.problem(dict(plain, bias=bias, **change))
        choice = OP.default_choice(p, "cupy", H200)
        if depthwise:
            assert choice == own_choice(p, "cupy", H200)
            assert choice.variant.startswith("depthwise")
        else:
            assert (choice.variant, choice.param_dict) == ("torch_cudnn", {"fuse": 0})
        assert OP.default_choice(p, "numpy", H200).variant != "torch_cudnn"
