"""The replay path on the GPU: a site records its second call and runs the recording from C++
after that (dnnctl.backends.replay). Every replayed call must give bitwise the results the
Python path gives on the same inputs, on fresh data every call, on a side stream and inside
a CUDA-graph capture.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_replay_gpu.py
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
pytest.importorskip("cupy")

from test_capture_ops import CL, _r  # noqa: E402  (tests/gpu is on the path)

import dnnctl.ops as dops  # noqa: E402
from dnnctl.backends import replay  # noqa: E402
from dnnctl.ops import dispatch  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def built():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DNNCTL_REPLAY", "1")
        if replay.module(wait=None) is None:
            pytest.skip(f"no replay extension here: {replay.failure()}")
        dispatch._SITES.clear()  # sites made before (replay off) would not record
        yield
        dispatch._SITES.clear()


def _bn_train(x, rm, rv, w, b):
    return dops.batch_norm(x, rm, rv, w, b, training=True, layout="NHWC", return_stats=True,
                           activation="relu")


def _bn_train_res(x, res, rm, rv, w, b):
    return dops.batch_norm(x, rm, rv, w, b, training=True, layout="NHWC", return_stats=True,
                           activation="relu", residual=res)


CASES = {
    # name: (make inputs, call, ops that must have replayed)
    "softmax fp16": (lambda: [_r(64, 1000, dtype=torch.float16)], dops.softmax, "softmax"),
    "log_softmax fp32": (lambda: [_r(33, 517)], dops.log_softmax, "softmax"),
    "layer_norm bf16": (lambda: [_r(64, 768, dtype=torch.bfloat16),
                                 _r(768, dtype=torch.bfloat16), _r(768, dtype=torch.bfloat16)],
                        dops.layer_norm, "layer_norm"),
    "rms_norm fp16": (lambda: [_r(16, 4096, dtype=torch.float16),
                               _r(4096, dtype=torch.float16)], dops.rms_norm, "rms_norm"),
    "gelu fp16 odd size": (lambda: [_r(7, 1001, dtype=torch.float16)], dops.gelu, "activation"),
    "relu fp32": (lambda: [_r(4, 64, 56, 56)], dops.relu, "activation"),
    "batch_norm training NHWC fp16 + relu": (
        lambda: [_r(8, 14, 14, 64, dtype=torch.float16), torch.zeros(64, device="cuda"),
                 torch.ones(64, device="cuda"), _r(64), _r(64)], _bn_train, "batch_norm"),
    "batch_norm training NHWC fp16 + residual + relu": (
        lambda: [_r(4, 7, 7, 256, dtype=torch.float16), _r(4, 7, 7, 256, dtype=torch.float16),
                 torch.zeros(256, device="cuda"), torch.ones(256, device="cuda"), _r(256),
                 _r(256)], _bn_train_res, "batch_norm"),
    "batch_norm_backward NHWC fp16": (
        lambda: [_r(8, 12, 12, 32, dtype=torch.float16), _r(8, 12, 12, 32, dtype=torch.float16),
                 _r(32), _r(32, positive=True), _r(32)],
        lambda dy, x, m, s, w: dops.batch_norm_backward(dy, x, m, s, weight=w, layout="NHWC"),
        None),
    "layer_norm_backward fp32": (lambda: [_r(64, 96), _r(64, 96), _r(96)],
                                 lambda dy, x, w: dops.layer_norm_backward(dy, x, w), None),
    "softmax_backward fp16": (lambda: [_r(64, 128, dtype=torch.float16),
                                       _r(64, 128, dtype=torch.float16)],
                              dops.softmax_backward, None),
    "group_norm NHWC fp32": (lambda: [_r(4, 8, 8, 32)],
                             lambda x: dops.group_norm(x, 4, layout="NHWC"), None),
}


def _flat(res):
    return [r for r in (res if isinstance(res, tuple) else (res,)) if r is not None]


def _python_path(fn, args):
    saved = {k: s.programs for k, s in dispatch._SITES.items()}
    for s in dispatch._SITES.values():
        s.programs = None
    try:
        return fn(*args)
    finally:
        for k, s in dispatch._SITES.items():
            s.programs = saved.get(k)


def _replayed(op):
    return any(s.op.name == op and s.programs and any(s.programs.values())
               for s in dispatch._SITES.values())


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_calls_equal_the_python_path_bitwise(name):
    make, fn, must = CASES[name]
    args = make()
    for call in range(5):
        for a in args:  # fresh data every call (statistics kept in range)
            if a.dtype.is_floating_point and a.dim() > 1:
                a.copy_(torch.randn_like(a, dtype=torch.float32).to(a.dtype))
        snap = [a.clone() for a in args]
        got = fn(*args)
        after = [a.clone() for a in args]  # running statistics written in place
        for a, s in zip(args, snap, strict=True):
            a.copy_(s)
        want = _python_path(fn, args)
        torch.cuda.synchronize()
        for g, w in zip(_flat(got), _flat(want), strict=True):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            assert torch.equal(g, w), f"{name}: call {call} differs from the Python path"
        for a, b in zip(args, after, strict=True):
            assert torch.equal(a, b), f"{name}: an in-place write differs"
    if must is not None:
        assert _replayed(must), f"{name}: never replayed ({dispatch.REFUSED.get(must)})"


def test_replay_on_a_side_stream_and_in_a_graph_capture():
    x = _r(64, 1000, dtype=torch.float16)
    for _ in range(3):
        dops.softmax(x)
    assert _replayed("softmax")
    want = _python_path(dops.softmax, (x,))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            got = dops.softmax(x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = dops.softmax(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, _python_path(dops.softmax, (x,)))


def test_a_misaligned_view_takes_the_python_path_and_is_right():
    big = _r(64 * 1000 + 8, dtype=torch.float16)
    x = big[:64000].view(64, 1000)
    for _ in range(3):
        dops.softmax(x)
    shifted = big[1:64001].view(64, 1000)
    got = dops.softmax(shifted)
    ref = torch.softmax(shifted.float(), -1).half()
    assert torch.allclose(got.float(), ref.float(), atol=2e-3)


# ----------------------------------------------------------------------------- native BN


# BatchNorm's gradients on dnnctl (the node's backward Program), every other op's on torch
# (cuDNN's convolutions, deterministic in these tests)
BN_ONLY = {"*": "plan", "batch_norm": "dnnctl"}


class _Block(torch.nn.Module):
    """conv -> BN -> ReLU, conv -> BN (+ the block's input) -> ReLU: both fused forms."""

    def __init__(self, c):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


def _native_nodes(y):
    from test_torch_backward_gpu import _node_names  # (tests/gpu is on the path)

    return sum("batch_norm_train_native" in n for n in _node_names(y.grad_fn))


@pytest.fixture()
def cudnn_deterministic():
    """cuDNN's convolution gradients the same from run to run (the comparison is bitwise)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_native_batch_norm_steps_equal_the_python_path_bitwise(dtype, cudnn_deterministic):
    import dnnctl.torch as dt
    from dnnctl.torch import native

    torch.manual_seed(0)
    c = 64
    model = torch.nn.Sequential(_Block(c), _Block(c)).cuda().to(memory_format=CL)
    ref = torch.nn.Sequential(_Block(c), _Block(c)).cuda().to(memory_format=CL)
    ref.load_state_dict(model.state_dict())
    dt.patch(model, backward=BN_ONLY)
    dt.patch(ref, backward=BN_ONLY)
    used = 0
    for step in range(6):
        x = torch.randn(8, c, 28, 28, device="cuda").to(memory_format=CL)
        outs = []
        for m, off in ((model, False), (ref, True)):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            with (torch.autocast("cuda", dtype=dtype),
                  native.suspended() if off else contextlib.nullcontext()):
                y = m(xi)
            if not off:
                used = max(used, _native_nodes(y))
                g = torch.randn_like(y)
            y.backward(g)
            outs.append((y, xi.grad, [p.grad for p in m.parameters()],
                         [b.clone() for b in m.buffers()]))
        (y1, gx1, gp1, b1), (y2, gx2, gp2, b2) = outs
        torch.cuda.synchronize()
        assert torch.equal(y1, y2), f"step {step}: outputs differ"
        assert torch.equal(gx1, gx2), f"step {step}: input gradients differ"
        for a, b in zip(gp1, gp2, strict=True):
            assert torch.equal(a, b), f"step {step}: a parameter gradient differs"
        for a, b in zip(b1, b2, strict=True):
            assert torch.equal(a, b), f"step {step}: a running statistic differs"
    # (2 to 4: the fused forms the patch found; every BatchNorm here may take the node)
    assert used >= 2, f"{used} of 4 BatchNorms on the C++ node ({native._TABLE})"


def test_native_batch_norm_double_backward_runs_torchs_formulas():
    import dnnctl.torch as dt

    c = 32
    model = _Block(c).cuda().to(memory_format=CL).half()
    model.b1.float()
    model.b2.float()
    dt.patch(model, backward=BN_ONLY)
    x = torch.randn(4, c, 14, 14, device="cuda", dtype=torch.half).to(memory_format=CL)
    for _ in range(4):
        model(x.requires_grad_()).float().sum().backward()
    xi = x.detach().requires_grad_()
    y = model(xi)
    assert _native_nodes(y) >= 1
    (g,) = torch.autograd.grad((y.float() ** 2).sum(), xi, create_graph=True)
    assert g.requires_grad  # a graph of its own: a gradient penalty can go through it
    g.float().pow(2).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# ----------------------------------------------------------------------------- convolutions


class _Only:
    """A plan whose only entry is every conv2d problem: ``variant`` with ``params``, else
    the variant's default parameters."""

    def __init__(self, variant, params=None):
        self.variant, self.params = variant, params

    def lookup(self, problem, backend, device):
        from dnnctl.ops.base import Choice
        from dnnctl.ops.registry import get_variant

        if problem.op != "conv2d":
            return None
        v = get_variant("conv2d", "cupy", self.variant)
        params = self.params or v.default_params(problem, device)
        if not v.supports(problem, device) or params is None:
            pytest.skip(f"{self.variant} does not take {dict(problem.as_dict())}")
        return Choice(self.variant, tuple(sorted(params.items())))


# variant, params, (N, C, H, W), K, kernel, stride, activation, residual, residual first
CONV_CASES = {
    "cuDNN conv + epilogue (bias, relu)": ("torch_cudnn", {"fuse": 0}, (2, 64, 14, 14), 64, 3,
                                           1, "relu", False, False),
    "cuDNN conv_relu": ("torch_cudnn", {"fuse": 1}, (2, 64, 14, 14), 128, 3, 2, "relu",
                        False, False),
    "cuDNN conv_add_relu": ("torch_cudnn", {"fuse": 1}, (2, 64, 14, 14), 256, 1, 1, "relu",
                            True, True),
    "cuDNN conv, no epilogue": ("torch_cudnn", {"fuse": 0}, (2, 32, 9, 9), 32, 3, 1, None,
                                False, False),
    "wgmma implicit GEMM + residual": ("implicit_gemm_wgmma", None, (2, 64, 14, 14), 64, 3, 1,
                                       "relu", True, True),
    "mma implicit GEMM": ("implicit_gemm", None, (2, 32, 10, 10), 64, 3, 1, "silu", False,
                          False),
    "1x1 GEMM + residual": ("gemm_1x1", None, (2, 64, 7, 7), 256, 1, 1, "relu", True, True),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_replayed_convolutions_equal_the_python_path_bitwise(name, cudnn_deterministic):
    from dnnctl.ops.conv2d.function import conv2d_channels_last

    variant, params, (n, c, h, w), k, r, s, act, res, first = CONV_CASES[name]
    plan = _Only(variant, params)
    x = _r(n, c, h, w, dtype=torch.float16, fmt=CL)
    wt = _r(k, c, r, r, dtype=torch.float16, fmt=CL) * 0.1
    bias = _r(k, dtype=torch.float16) if act or variant != "torch_cudnn" else None
    p = (h + 2 * (r // 2) - r) // s + 1
    z = _r(n, k, p, (w + 2 * (r // 2) - r) // s + 1, dtype=torch.float16, fmt=CL) if res else None

    def fn(x, wt, z):
        return conv2d_channels_last(x, wt, bias, (s, s), (r // 2, r // 2), (1, 1), 1, act, z,
                                    residual_before_act=first, plan=plan)

    for call in range(5):
        for a in (x, wt, z):
            if a is not None:
                a.copy_(torch.randn_like(a))
        got = fn(x, wt, z)
        want = _python_path(fn, (x, wt, z))
        torch.cuda.synchronize()
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want), f"{name}: call {call} differs from the Python path"
    site = next(s for s in dispatch._SITES.values()
                if s.op.name == "conv2d" and s.programs and any(s.programs.values()))
    prog = next(p for p in site.programs.values() if p)
    if variant == "torch_cudnn":
        assert prog.torch_calls == 1
    if variant == "torch_cudnn" and bias is None and not res:
        # the call taken straight to cuDNN's convolution is torch's own, bitwise; and with
        # cuDNN turned off after the recording, the replay follows torch to its other kernel
        # (the result is y's (N, P, Q, K) array)
        want = torch.nn.functional.conv2d(x, wt, None, s, r // 2).permute(0, 2, 3, 1)
        assert torch.equal(fn(x, wt, z), want)
        torch.backends.cudnn.enabled = False
        try:
            off = torch.nn.functional.conv2d(x, wt, None, s, r // 2).permute(0, 2, 3, 1)
            got = fn(x, wt, z)
        finally:
            torch.backends.cudnn.enabled = True
        assert torch.equal(got, off)
    dispatch._SITES.clear()


class _Bottleneck(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c // 4, 1, bias=False), torch.nn.BatchNorm2d(c // 4)
        self.c2 = torch.nn.Conv2d(c // 4, c // 4, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c // 4)
        self.c3, self.b3 = torch.nn.Conv2d(c // 4, c, 1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + x)


def test_fused_convolutions_take_their_programs_directly_and_equal_the_python_path(
        cudnn_deterministic):
    import dnnctl.torch as dt
    from dnnctl.torch import native
    from dnnctl.torch.fuse import FusedConv

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Bottleneck(256), _Bottleneck(256)).cuda().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics that move the fold
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    model = model.half().to(memory_format=CL)
    dt.patch(model)
    x = torch.randn(4, 256, 14, 14, device="cuda", dtype=torch.half).to(memory_format=CL)
    side = torch.cuda.Stream()
    with torch.inference_mode():
        for step in range(6):
            x.copy_(torch.randn_like(x))
            got = model(x)
            with native.suspended():  # (and no site's Program: the Python path all through)
                want = _python_path(model, (x,))
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                got_side = model(x)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            assert torch.equal(got, want), f"step {step}: the direct path differs"
            assert torch.equal(got_side, want), f"step {step}: a side stream's call differs"
    fused = [m for m in model.modules() if isinstance(m, FusedConv)]
    direct = sum(1 for m in fused for v in m._direct.sites.values() if v.__class__ is not int)
    assert direct >= len(fused) - 1, f"{direct} of {len(fused)} fused convs direct"


# ----------------------------------------------------------------------------- attention


class _AttnOnly:
    def __init__(self, variant):
        self.variant = variant

    def lookup(self, problem, backend, device):
        from dnnctl.ops.base import Choice
        from dnnctl.ops.registry import get_variant

        if problem.op != "attention":
            return None
        if not get_variant("attention", "cupy", self.variant).supports(problem, device):
            pytest.skip(f"{self.variant} does not take {dict(problem.as_dict())}")
        return Choice(self.variant, ())


@pytest.mark.parametrize("variant", ["torch_flash", "torch_cudnn", "torch_efficient"])
@pytest.mark.parametrize("causal", [False, True])
def test_replayed_vendor_attention_equals_the_python_path_bitwise(variant, causal):
    plan = _AttnOnly(variant)
    # q / k / v as views of one packed (B, S, 3, H, D) projection, as a ViT's are
    qkv = _r(2, 197, 3, 12, 64, dtype=torch.float16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))

    def fn(q, k, v):
        return dops.attention(q, k, v, causal=causal, return_lse=True, plan=plan)

    for call in range(5):
        qkv.copy_(torch.randn_like(qkv))
        got = fn(q, k, v)
        want = _python_path(fn, (q, k, v))
        torch.cuda.synchronize()
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.stride() == w.stride()
            assert torch.equal(g, w), f"{variant}: call {call} differs from the Python path"
    if variant != "torch_efficient":  # (its lse is a padded slice: copied, not replayed)
        assert _replayed("attention"), dispatch.REFUSED.get("attention")
    dispatch._SITES.clear()


class _VitBlock(torch.nn.Module):
    def __init__(self, d=384, h=6):
        super().__init__()
        self.h = h
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.n1(x)).reshape(b, s, 3, self.h, d // self.h)
        q, k, v = qkv.unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.n2(x))))


def _direct_equals_python(model, x):
    """Six calls of a patched model on fresh x: each bitwise its Python path's result (no
    module's Direct and no site's Program)."""
    from dnnctl.torch import native

    with torch.inference_mode():
        for step in range(6):
            x.copy_(torch.randn_like(x))
            got = model(x)
            with native.suspended():
                want = _python_path(model, (x,))
            torch.cuda.synchronize()
            assert torch.equal(got, want), f"step {step}: the direct path differs"


def test_layer_norm_and_sdpa_take_their_programs_directly_and_equal_the_python_path():
    import dnnctl.torch as dt
    from dnnctl.torch import attention

    torch.manual_seed(0)
    model = torch.nn.Sequential(_VitBlock(), _VitBlock()).cuda().half().eval()
    dt.patch(model)
    x = torch.randn(4, 197, 384, device="cuda", dtype=torch.half)
    _direct_equals_python(model, x)
    direct_sdpa = [v for v in attention._DIRECT.sites.values() if v.__class__ is not int]
    assert direct_sdpa, f"no SDPA call went direct ({dispatch.REFUSED.get('attention')})"


@pytest.mark.parametrize("act", [torch.nn.GELU, torch.nn.ReLU])
def test_fused_linears_take_their_programs_directly_and_equal_the_python_path(act):
    import dnnctl.torch as dt
    from dnnctl.torch.fuse import FusedLinear

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(384), torch.nn.Linear(384, 1536), act(),
                                torch.nn.Linear(1536, 384)).cuda().half().eval()
    dt.patch(model)
    gm = model.forward.gm  # (a traced top-level model: its fused chains live in its graph)
    fused = [m for m in gm.modules() if isinstance(m, FusedLinear)]
    assert len(fused) == 1, "linear -> activation was not fused"
    x = torch.randn(4, 197, 384, device="cuda", dtype=torch.half)
    _direct_equals_python(model, x)
    direct = [v for v in fused[0]._direct.sites.values() if v.__class__ is not int]
    assert direct, f"the fused linear never went direct ({dispatch.REFUSED.get('matmul')})"


class _MatOnly:
    def lookup(self, problem, backend, device):
        from dnnctl.ops.base import Choice

        return Choice("cublaslt", ()) if problem.op == "matmul" else None


@pytest.mark.parametrize("bias,act", [(True, "gelu"), (True, "relu"), (True, "none"),
                                      (False, "gelu"), (False, "none")])
def test_cublaslt_from_torch_replays_torchs_call(bias, act):
    """cuBLASLt from torch tensors is torch's own call (addmm / _addmm_activation / mm, an
    ATen op a replay calls again): bitwise the Python path, right against float32."""
    plan = _MatOnly()
    x = _r(197 * 4, 384, dtype=torch.float16)
    w = _r(1536, 384, dtype=torch.float16) * 0.05
    b = _r(1536, dtype=torch.float16) if bias else None

    def fn(x, w, b):
        return dops.matmul(x, w.t(), bias=b, activation=None if act == "none" else act,
                           plan=plan)

    for call in range(5):
        x.copy_(torch.randn_like(x))
        got = fn(x, w, b)
        want = _python_path(fn, (x, w, b))
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"call {call} differs from the Python path"
    ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    ref = {"gelu": lambda r: torch.nn.functional.gelu(r, approximate="tanh"),
           "relu": torch.relu, "none": lambda r: r}[act](ref)
    assert torch.allclose(got.float(), ref, atol=2e-2, rtol=2e-2)
    assert _replayed("matmul"), dispatch.REFUSED.get("matmul")
    dispatch._SITES.clear()


def test_rms_norms_take_their_programs_directly_and_equal_the_python_path():
    import dnnctl.torch as dt
    from dnnctl.torch import native

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.RMSNorm(4096), torch.nn.Linear(4096, 4096),
                                torch.nn.RMSNorm(4096)).cuda().to(torch.bfloat16).eval()
    dt.patch(model)
    x = torch.randn(8, 1, 4096, device="cuda", dtype=torch.bfloat16)
    _direct_equals_python(model, x)
    directs = [next(a for a in m.forward.args if isinstance(a, native.Direct))
               for m in (model[0], model[2])]
    assert all(any(v.__class__ is not int for v in d.sites.values()) for d in directs), \
        dispatch.REFUSED.get("rms_norm")
