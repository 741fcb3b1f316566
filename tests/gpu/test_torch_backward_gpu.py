"""torch.ops.dnnctl gradients on dnnctl's own CUDA backward kernels (backward="dnnctl")
against torch autograd in float64 on the same (rounded) inputs, fp16 / bf16 / fp32, NCHW and
channels-last; every backward call must run on dnnctl (no refusal, no torch formula).

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_torch_backward_gpu.py
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
pytest.importorskip("cupy")
dt = pytest.importorskip("dnnctl.torch")

import torch.nn.functional as F  # noqa: E402

from dnnctl.torch import grad_plan, kernels, keys  # noqa: E402
from dnnctl.torch import own_grads as og  # noqa: E402

pytestmark = pytest.mark.gpu
OPS = torch.ops.dnnctl
DNN = kernels.plan_handle(None, "dnnctl")
CL = torch.channels_last
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def _check(fn, ref, inputs, dtype, path="dnnctl"):
    torch.manual_seed(1)
    a = [t.to("cuda", dtype).requires_grad_(True) for t in inputs]
    b = [t.detach().double().requires_grad_(True) for t in a]  # the same values, exact
    grad_plan.BACKWARD_PATHS.clear()
    fallbacks = dict(kernels.FALLBACKS)
    y = fn(*a)
    g = torch.randn(y.shape, device="cuda").to(dtype)
    y.backward(g)
    torch.cuda.synchronize()
    paths = grad_plan.paths_summary()
    ref(*b).backward(g.double())
    other = "torch" if path == "dnnctl" else "dnnctl"
    assert paths and all(v[other] == 0 for v in paths.values()), paths
    assert dict(kernels.FALLBACKS) == fallbacks
    for u, v in zip(a, b):
        err = float((u.grad.double() - v.grad).abs().max() / v.grad.abs().max())
        assert err < TOL[dtype], (err, u.shape)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("fmt", ["nchw", "nhwc"])
@pytest.mark.parametrize("stride,groups,dil", [(1, 1, 1), (2, 1, 1), (2, 2, 1), (1, 1, 2),
                                               (1, 16, 1)])
def test_conv2d(dtype, fmt, stride, groups, dil, monkeypatch):
    """dnnctl's own dgrad / wgrad kernels: the default heuristic's cuDNN pick for a dense
    layer's gradients is turned off here (backward="dnnctl" hands a vendor pick to torch's
    own formula)."""
    from dnnctl.ops.conv2d import op as conv_op

    monkeypatch.setattr(conv_op, "_cudnn_gradient_default", lambda problem: False)
    monkeypatch.setattr(grad_plan, "_VENDOR", {})
    x, w = torch.randn(3, 16, 15, 13), torch.randn(32, 16 // groups, 3, 3)
    b = torch.randn(32)
    if fmt == "nhwc":
        x, w = x.contiguous(memory_format=CL), w.contiguous(memory_format=CL)
    _check(lambda x, w, b: OPS.conv2d(x, w, b, [stride] * 2, [dil] * 2, [dil] * 2, groups,
                                      "none", None, DNN),
           lambda x, w, b: F.conv2d(x, w, b, stride, dil, dil, groups), (x, w, b), dtype)


def _distinct_planes(n: int, c: int, h: int, w: int) -> torch.Tensor:
    """Each (h, w) plane a permutation of distinct small integers / 32: exact in fp16 and
    bf16, so no pooling window has a tie (a tie's gradient may go to either input)."""
    assert h * w <= 256
    perm = torch.argsort(torch.rand(n * c, h * w), dim=1).float()
    return ((perm - h * w // 2) / 32).reshape(n, c, h, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_memory_ops(dtype):
    x4 = _distinct_planes(4, 32, 14, 14).contiguous(memory_format=CL)
    rows = torch.randn(64, 768)
    c = torch.randn(32)
    _check(lambda x, w, b: OPS.layer_norm(x, w, b, 1e-5, DNN),
           lambda x, w, b: F.layer_norm(x, (768,), w, b), (rows, torch.randn(768),
                                                           torch.randn(768)), dtype)
    _check(lambda x: OPS.softmax(x, -1, DNN), lambda x: F.softmax(x, -1), (rows,), dtype)
    # a plain BN's backward defaults to torch's own (cuDNN's; faster on 5 of ResNet-50's 6
    # shapes): backward="dnnctl" hands that vendor pick to torch's formula; the fused ReLU's
    # is dnnctl's kernel
    _check(lambda x, w, b: OPS.batch_norm_train(
        x, torch.zeros(32, device="cuda"), torch.ones(32, device="cuda"), w.float(),
        b.float(), 0.1, 1e-5, DNN)[0],
           lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (x4, c, c.clone()), dtype,
           path="torch")
    _check(lambda x, w, b: OPS.batch_norm_train(
        x, torch.zeros(32, device="cuda"), torch.ones(32, device="cuda"), w.float(),
        b.float(), 0.1, 1e-5, DNN, "relu")[0],
           lambda x, w, b: F.relu(F.batch_norm(x, None, None, w, b, True)), (x4, c, c.clone()),
           dtype)
    _check(lambda x: OPS.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False, DNN),
           lambda x: F.max_pool2d(x, 3, 2, 1), (x4,), dtype)
    _check(lambda x: OPS.global_avg_pool2d(x, DNN), lambda x: x.mean((2, 3), keepdim=True),
           (x4,), dtype)
    _check(lambda x: OPS.relu(x, DNN), F.relu, (x4,), dtype)
    _check(lambda x: OPS.gelu(x, "none", DNN), F.gelu, (rows,), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["nchw", "nhwc"])
def test_batch_norm_train_on_torchs_path(dtype, fmt):
    """backward="torch": the fused BN + ReLU [+ residual] gradient gated by the saved
    output, then cuDNN's batch_norm backward (fp16 / fp32, what torch picks) or torch's
    native one (bf16), against float64."""
    torch_handle = kernels.plan_handle(None, "torch")
    x4 = _distinct_planes(4, 32, 14, 14)
    if fmt == "nhwc":
        x4 = x4.contiguous(memory_format=CL)
    c = torch.randn(32)
    stats = (torch.zeros(32, device="cuda"), torch.ones(32, device="cuda"))
    _check(lambda x, w, b: OPS.batch_norm_train(x, *stats, w.float(), b.float(), 0.1, 1e-5,
                                                torch_handle)[0],
           lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (x4, c, c.clone()), dtype,
           "torch")
    seen = []  # the ReLU's mask from the op's own output: a float64 pre-activation within
    # rounding of 0 may fall on the other side

    def fused(x, w, b, z):
        y = OPS.batch_norm_train(x, *stats, w.float(), b.float(), 0.1, 1e-5, torch_handle,
                                 "relu", z)[0]
        seen.append(y.detach() > 0)
        return y

    _check(fused,
           lambda x, w, b, z: (F.batch_norm(x, None, None, w, b, True) + z) * seen[-1],
           (x4, c, c.clone(), torch.randn(x4.shape).contiguous(memory_format=CL)), dtype,
           "torch")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear(dtype, monkeypatch):
    """dnnctl's own products for linear's backward: the default heuristic's vendor picks
    (cuBLAS / cuBLASLt, which backward="dnnctl" hands to torch's own formula) are left out
    of its ranking here."""
    from dnnctl.ops.matmul import op as mm_op
    from dnnctl.ops.registry import get_variant

    ranked = mm_op.ranked
    monkeypatch.setattr(mm_op, "ranked", lambda p, b, d: [
        e for e in ranked(p, b, d) if not get_variant("matmul", b, e.variant).vendor])
    monkeypatch.setattr(mm_op, "FALLBACK", ["wgmma", "mma", "simt"])
    monkeypatch.setattr(grad_plan, "_VENDOR", {})
    _check(lambda x, w, b: OPS.linear(x, w, b, "none", DNN), F.linear,
           (torch.randn(8, 197, 768), torch.randn(3072, 768) * 0.03, torch.randn(3072)),
           dtype)


def _node_names(fn):
    """Names of every autograd node reachable from ``fn``."""
    seen, stack, names = set(), [fn], []
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.append(f.name())
        stack.extend(g for g, _ in f.next_functions)
    return names


@pytest.mark.parametrize("mode", ["plan", "dnnctl"])
def test_patched_training_hands_a_vendor_conv_and_linear_to_torch_whole(mode):
    """Under autograd a conv / linear whose forward and gradients dnnctl would all give to
    cuDNN / cuBLAS runs torch's own function (torch's autograd node, no dnnctl op), counted
    as a vendor call and torch gradients; the gradients are eager's."""
    from torch import nn

    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.Flatten(),
                         nn.Linear(32 * 8 * 8, 1024)).cuda().to(memory_format=CL)
    # the linear goes to torch whole only where dnnctl's own picks say cuBLAS for its
    # product and both gradients (the default for a dense fp16 conv's are cuDNN's)
    flat = torch.empty(4, 32 * 8 * 8, device="cuda", dtype=torch.float16)
    lin = grad_plan.torch_trains(
        "matmul", kernels.plan_handle(None, mode), flat, base[2].weight, ("probe",),
        lambda xm, wm: keys.linear(xm, wm, True, "none"),
        lambda xm, wm: og.linear_keys(xm, wm))
    x = torch.randn(4, 16, 8, 8, device="cuda").to(memory_format=CL).requires_grad_(True)
    patched = copy.deepcopy(base)
    dt.patch(patched, None, backward=mode)
    grads = []
    for model in (base, patched):
        grad_plan.BACKWARD_PATHS.clear()
        via = dict(kernels.VENDOR_VIA_TORCH)
        x.grad = None
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            y = model(x)
        y.float().square().sum().backward()
        grads.append([x.grad.clone(), *(p.grad.clone() for p in model.parameters())])
        if model is patched:
            assert kernels.VENDOR_VIA_TORCH["conv2d"] == via.get("conv2d", 0) + 1
            paths = grad_plan.paths_summary()
            assert paths["conv2d/dgrad"] == {"dnnctl": 0, "torch": 1}, paths
            assert paths["conv2d/wgrad"] == {"dnnctl": 0, "torch": 1}, paths
            assert (kernels.VENDOR_VIA_TORCH["matmul"] == via.get("matmul", 0) + 1) == lin
        names = _node_names(y.grad_fn)
        assert any(n.startswith("Convolution") for n in names), names
        assert not any(n.startswith("DnnctlBackward_conv2d") for n in names), names
    for a, b in zip(*grads):  # fp16 products: eager's within rounding
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err < 1e-2, (err, a.shape)
