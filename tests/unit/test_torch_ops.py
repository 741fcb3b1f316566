"""torch.ops.dnnctl.*: results equal torch's on CPU (numpy backend), opcheck passes (schema,
fake kernel, autograd registration, AOT dispatch), gradients pass gradcheck in float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
dt = pytest.importorskip("dnnctl.torch")

from torch.library import opcheck  # noqa: E402

D = torch.ops.dnnctl
CL = torch.channels_last


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_GEN, dtype=dtype)


_GEN = torch.Generator().manual_seed(0)


def _cases():
    """(name, op, args, torch reference of the same args)."""
    x4, w, b = _r(2, 6, 9, 7), _r(4, 6, 3, 3), _r(4)
    res, wg = _r(2, 4, 9, 7), _r(4, 3, 3, 3)
    xr, g, bb = _r(3, 5, 16), _r(16), _r(16)
    bn = (_r(6), _r(6).abs() + 0.5, _r(6), _r(6))
    zr = _r(2, 6, 9, 7)
    return [
        ("conv2d", D.conv2d, (x4, w, b, [1, 1], [1, 1], [1, 1], 1, "relu", res),
         lambda: F.relu(F.conv2d(x4, w, b, padding=1)) + res),
        ("conv2d_res_before_act", D.conv2d, (x4, w, b, [1, 1], [1, 1], [1, 1], 1, "silu", res,
                                             0, True),
         lambda: F.silu(F.conv2d(x4, w, b, padding=1) + res)),
        ("conv2d_cl", D.conv2d, (x4.contiguous(memory_format=CL), wg.contiguous(memory_format=CL),
                                 None, [2, 2], [0, 0], [1, 1], 2, "none", None),
         lambda: F.conv2d(x4, wg, None, 2, groups=2)),
        ("conv_transpose2d", D.conv_transpose2d, (x4, _r(6, 2, 3, 3), _r(4), [2, 2], [1, 1],
                                                  [1, 0], [1, 1], 2),
         lambda: None),
        ("linear", D.linear, (xr, _r(8, 16), _r(8), "gelu"),
         lambda: None),
        ("matmul", D.matmul, (_r(3, 4, 5), _r(5, 6)), lambda: None),
        ("layer_norm", D.layer_norm, (xr, g, bb, 1e-5), lambda: F.layer_norm(xr, (16,), g, bb)),
        ("rms_norm", D.rms_norm, (xr, g, 1e-6), lambda: None),
        ("batch_norm", D.batch_norm, (x4, *bn, 1e-5),
         lambda: F.batch_norm(x4, bn[0], bn[1], bn[2], bn[3], False)),
        ("batch_norm_relu", D.batch_norm, (x4, *bn, 1e-5, 0, "relu"),
         lambda: F.relu(F.batch_norm(x4, bn[0], bn[1], bn[2], bn[3], False))),
        ("batch_norm_add_relu", D.batch_norm, (x4, *bn, 1e-5, 0, "relu", zr),
         lambda: F.relu(F.batch_norm(x4, bn[0], bn[1], bn[2], bn[3], False) + zr)),
        ("group_norm", D.group_norm, (x4, 3, _r(6), _r(6), 1e-5),
         lambda: None),
        ("softmax", D.softmax, (xr, 1), lambda: F.softmax(xr, 1)),
        ("log_softmax", D.log_softmax, (xr, -1), lambda: F.log_softmax(xr, -1)),
        ("max_pool2d", D.max_pool2d, (x4, [3, 3], [2, 2], [1, 1], [1, 1], True),
         lambda: F.max_pool2d(x4, 3, 2, 1, ceil_mode=True)),
        ("avg_pool2d", D.avg_pool2d, (x4.contiguous(memory_format=CL), [2, 2], [], [1, 1],
                                      False, False),
         lambda: F.avg_pool2d(x4, 2, padding=1, count_include_pad=False)),
        ("global_avg_pool2d", D.global_avg_pool2d, (x4,), lambda: x4.mean((2, 3), True)),
        ("relu", D.relu, (x4,), lambda: F.relu(x4)),
        ("silu", D.silu, (x4.contiguous(memory_format=CL),), lambda: F.silu(x4)),
        ("sigmoid", D.sigmoid, (xr,), lambda: torch.sigmoid(xr)),
        ("tanh", D.tanh, (xr,), lambda: torch.tanh(xr)),
        ("gelu", D.gelu, (xr, "tanh"), lambda: F.gelu(xr, approximate="tanh")),
        ("leaky_relu", D.leaky_relu, (xr, 0.2), lambda: F.leaky_relu(xr, 0.2)),
        ("relu6", D.relu6, (4 * x4,), lambda: F.relu6(4 * x4)),
        ("hardswish", D.hardswish, ((4 * x4).contiguous(memory_format=CL),),
         lambda: F.hardswish(4 * x4)),
        ("hardsigmoid", D.hardsigmoid, (4 * xr,), lambda: F.hardsigmoid(4 * xr)),
    ]


CASES = _cases()
IDS = [c[0] for c in CASES]


def _expected(name, args, ref):
    out = ref()
    if out is not None:
        return out
    if name == "linear":
        x, w, b, act = args
        return F.gelu(F.linear(x, w, b))
    if name == "matmul":
        return args[0] @ args[1]
    if name == "conv_transpose2d":
        x, w, b, st, pad, opad, dil, groups = args
        return F.conv_transpose2d(x, w, b, st, pad, opad, groups, dil)
    if name == "rms_norm":
        x, g, eps = args
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    if name == "group_norm":
        x, groups, w, b, eps = args
        return F.group_norm(x, groups, w, b, eps)
    raise AssertionError(name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_runs_on_dnnctl_and_matches_torch(case):
    name, op, args, ref = case
    before = sum(dt.FALLBACKS.values())
    got = op(*args)
    assert sum(dt.FALLBACKS.values()) == before, dict(dt.FALLBACKS)  # dnnctl ran it
    want = _expected(name, args, ref)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if args[0].dim() == 4 and name != "global_avg_pool2d":  # the memory format follows x
        cl = args[0].is_contiguous(memory_format=CL) and not args[0].is_contiguous()
        assert got.is_contiguous(memory_format=CL if cl else torch.contiguous_format)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_opcheck(case):
    _, op, args, _ = case
    res = opcheck(op.default, args)
    assert set(res.values()) == {"SUCCESS"}, res


def _double(args):
    return tuple(a.double().detach().requires_grad_(a.is_floating_point()) if isinstance(
        a, torch.Tensor) else a for a in args)


_BN_CASES = ("batch_norm", "batch_norm_relu", "batch_norm_add_relu")


@pytest.mark.parametrize("case", [c for c in CASES if c[0] not in _BN_CASES],
                         ids=[i for i in IDS if i not in _BN_CASES])
def test_gradcheck_float64(case):
    name, op, args, _ = case
    args = _double(args)
    if name.startswith("max_pool"):  # no ties: distinct values
        args = (torch.randperm(args[0].numel(), dtype=torch.float64).reshape(
            args[0].shape).requires_grad_(), *args[1:])
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def fn(*ts):
        full = list(args)
        for i, t in zip(tensors, ts):
            full[i] = t
        return op(*full)

    assert torch.autograd.gradcheck(fn, tuple(args[i] for i in tensors), fast_mode=True)


def test_batch_norm_gradcheck_eval_and_train():
    x = _r(3, 4, 5, 5, dtype=torch.float64).requires_grad_()
    w = _r(4, dtype=torch.float64).requires_grad_()
    b = _r(4, dtype=torch.float64).requires_grad_()
    rm, rv = _r(4, dtype=torch.float64), _r(4, dtype=torch.float64).abs() + 0.5
    assert torch.autograd.gradcheck(lambda x, w, b: D.batch_norm(x, rm, rv, w, b, 1e-5),
                                    (x, w, b), fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: D.batch_norm_train(x, rm, rv, w, b, 0.1, 1e-5)[0], (x, w, b),
        fast_mode=True)
    # the fused ReLU (training: its gradient gated by the saved output, as torch's ReLU
    # does; inference: the mask recomputed in the backward)
    assert torch.autograd.gradcheck(
        lambda x, w, b: D.batch_norm(x, rm, rv, w, b, 1e-5, 0, "relu"), (x, w, b),
        fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: D.batch_norm_train(x, rm, rv, w, b, 0.1, 1e-5, 0, "relu")[0],
        (x, w, b), fast_mode=True)
    # and with a residual added before the ReLU (its gradient too)
    z = _r(3, 4, 5, 5, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w, b, z: D.batch_norm_train(x, rm, rv, w, b, 0.1, 1e-5, 0, "relu", z)[0],
        (x, w, b, z), fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b, z: D.batch_norm(x, rm, rv, w, b, 1e-5, 0, "relu", z), (x, w, b, z),
        fast_mode=True)


def test_batch_norm_train_updates_statistics_like_torch():
    x = _r(4, 3, 6, 6).contiguous(memory_format=CL)
    rm, rv, w, b = _r(3), _r(3).abs() + 0.5, _r(3), _r(3)
    y, nm, nv, mean, invstd = D.batch_norm_train(x, rm, rv, w, b, 0.2, 1e-5)
    rm2, rv2 = rm.clone(), rv.clone()
    want = F.batch_norm(x, rm2, rv2, w, b, True, 0.2, 1e-5)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(nm, rm2)
    torch.testing.assert_close(nv, rv2)
    torch.testing.assert_close(mean, x.mean((0, 2, 3)))
    assert not torch.equal(nm, rm)  # the inputs are not mutated (a functional op)
    res = opcheck(D.batch_norm_train.default, (x, rm, rv, w, b, 0.2, 1e-5))
    assert set(res.values()) == {"SUCCESS"}, res


def test_half_precision_runs_on_dnnctl():
    x = _r(4, 32).to(torch.bfloat16)
    before = sum(dt.FALLBACKS.values())
    y = D.softmax(x, -1)
    assert y.dtype == torch.bfloat16 and sum(dt.FALLBACKS.values()) == before
    torch.testing.assert_close(y.float(), F.softmax(x.float(), -1), rtol=1e-2, atol=1e-2)
    h = D.layer_norm(x.half(), None, None, 1e-5)
    torch.testing.assert_close(h.float(), F.layer_norm(x.float(), (32,)), rtol=1e-2, atol=1e-2)


def test_float64_runs_on_torch_and_is_counted():
    x = _r(3, 7, dtype=torch.float64)
    before = dt.FALLBACKS[("softmax", "dtype not float32/float16/bfloat16")]
    torch.testing.assert_close(D.softmax(x, -1), F.softmax(x, -1))
    assert dt.FALLBACKS[("softmax", "dtype not float32/float16/bfloat16")] == before + 1


def test_compile_fullgraph_traces_the_ops():
    def f(x, w):
        y = D.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "relu", None)
        return D.softmax(D.layer_norm(y.flatten(1), None, None, 1e-5), -1)

    x, w = _r(2, 3, 6, 6), _r(4, 3, 3, 3)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    torch.testing.assert_close(got, f(x, w))


def test_tracing_registers_every_op_with_inductor_before_it_lowers():
    """Inductor lowers each dnnctl op as an extern call registered ahead of its lowering:
    its own "implicit fallback" path wrote every argument's producer graph out as text
    (torch 2.11: minutes for a ResNet's last op)."""
    from torch._inductor import lowering

    from dnnctl.torch import library

    def f(x, w):
        return D.global_avg_pool2d(D.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "relu",
                                            None))

    x, w = _r(2, 3, 6, 6), _r(4, 3, 3, 3)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    torch.testing.assert_close(got, f(x, w))
    assert library._INDUCTOR_FALLBACKS == [True]
    missing = [n for n in library.OPS
               if getattr(torch.ops.dnnctl, n).default not in lowering.lowerings]
    assert missing == []


def test_import_dnnctl_never_imports_torch_and_dnnctl_torch_needs_it():
    import subprocess
    import sys

    code = ("import sys, dnnctl, dnnctl.ops; dnnctl.ops.softmax; dnnctl.ops.conv2d; "
            "dnnctl.ops.batch_norm; print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip() == "False", res.stderr
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import dnnctl.torch\n"
            "except Exception as e:\n    print(type(e).__name__, e.hint)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip() == "BackendUnavailableError pip install 'dnnctl[torch]'", (
        res.stdout + res.stderr)


def _qkv(dtype=torch.float16, hq=4, hkv=2, s=9, d=16):
    return (_r(2, hq, s, d).to(dtype), _r(2, hkv, s + 3, d).to(dtype),
            _r(2, hkv, s + 3, d).to(dtype))


def test_attention_op_runs_on_dnnctl_with_its_lse():
    """torch.ops.dnnctl.attention = SDPA (+ its log-sum-exp), on dnnctl for 16-bit tensors:
    grouped heads with enable_gqa, torch's top-left causal mask, a given scale."""
    q, k, v = _qkv()
    before = sum(dt.FALLBACKS.values())
    out, lse = D.attention(q, k, v, True, 0.3, True)
    assert sum(dt.FALLBACKS.values()) == before, dict(dt.FALLBACKS)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                          scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)
    s = 0.3 * q.float() @ k.float().repeat_interleave(2, 1).transpose(-1, -2)
    s = s.masked_fill(~torch.ones(9, 12, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-4, atol=1e-4)
    assert lse.dtype == torch.float32 and out.dtype == torch.float16
    # torch's fused SDPA layout, (B, S, H, D) memory, as the fake kernel declares it
    assert out.stride() == (9 * 4 * 16, 16, 4 * 16, 1)


def test_attention_under_inductor_keeps_the_promised_layout():
    """Inductor's code checks each extern result's strides against the fake kernel's: the
    op's out has one layout whichever kernel ran (a ViT's patched SDPA under torch.compile
    failed on this), including a single query (decode)."""
    def f(a, b, c):
        return D.attention(a, b, c, False, None, True)[0] * 2

    for s in (9, 1):
        q, k, v = _qkv(s=s)
        got = torch.compile(f, fullgraph=True)(q, k, v)
        torch.testing.assert_close(got, f(q, k, v))


def test_attention_opcheck_gradcheck_and_compile():
    q, k, v = _qkv()
    res = opcheck(D.attention.default, (q, k, v, True, None, True))
    assert set(res.values()) == {"SUCCESS"}, res
    q64, k64, v64 = (t.double().requires_grad_() for t in _qkv(hq=2, hkv=1, s=5, d=4))
    assert torch.autograd.gradcheck(lambda a, b, c: D.attention(a, b, c, True, None, True)[0],
                                    (q64, k64, v64), fast_mode=True)

    def f(a, b, c):
        return D.attention(a, b, c, False, None, True)[0].sum(-1)

    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v),
                               f(q, k, v))


@pytest.mark.parametrize("mode", ["dnnctl", "torch"])
def test_attention_gradients_on_either_backward_path(mode):
    """dq, dk, dv from dnnctl's attention backward (the saved out and lse) or torch's, both
    against torch's autograd in float32; the path taken is counted."""
    from dnnctl.torch import kernels

    q, k, v = (t.requires_grad_() for t in _qkv())
    handle = kernels.plan_handle(None, mode)
    before = dict(dt.BACKWARD_PATHS)
    out, _ = D.attention(q, k, v, True, None, True, handle)
    g = _r(*out.shape).half()
    out.backward(g)
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True).backward(g.float())
    for got, want in zip((q.grad, k.grad, v.grad), (t.grad for t in ref)):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    key = ("attention", "backward", mode)
    assert dt.BACKWARD_PATHS[key] == before.get(key, 0) + 1


def test_torch_ops_refuse_what_torch_refuses_and_run_what_torch_runs():
    """The fallbacks keep torch's meaning: no broadcast rms_norm weight, no NaN running
    variance from one value per channel, clear errors for zero groups, a 3-D global pool and
    an unknown epilogue activation; an empty linear gives the bias (as F.linear)."""
    ops = torch.ops.dnnctl
    with pytest.raises(RuntimeError, match="weight has shape"):
        ops.rms_norm(torch.randn(6, 10), torch.randn(4, 6, 10))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ops.batch_norm_train(torch.randn(1, 6), torch.zeros(6), torch.ones(6), None, None)
    with pytest.raises(RuntimeError, match="num_groups"):
        ops.group_norm(torch.randn(2, 6, 3, 3), 0)
    with pytest.raises(RuntimeError, match="4-D"):
        ops.global_avg_pool2d(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="activation 'sigmoid'"):
        ops.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), activation="sigmoid")
    b = torch.randn(3)
    torch.testing.assert_close(ops.linear(torch.randn(4, 0), torch.randn(3, 0), b),
                               b.expand(4, 3))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_vendor_route_decides_a_conv_and_a_linear_key(layout):
    """torch_runs validates the call's key itself once (a conv key holds lists): on CPU the
    choice is a numpy variant, so neither runs as torch's own op, and the answer is kept."""
    from dnnctl.torch import kernels, keys
    from dnnctl.torch._tensors import ints

    x = torch.randn(2, 4, 9, 9)
    w = torch.randn(6, 4, 3, 3)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    st, pad, dil = ints(2, 2), ints(1, 2), ints(1, 2)

    def conv_key():
        return keys.conv2d(x, w, False, st, pad, dil, 1, "none", False, layout == "nhwc")

    call_key = (x.shape, w.shape, st, pad, dil, layout)
    assert kernels.torch_runs("conv2d", conv_key, x, 0, call_key) is False
    assert kernels.torch_runs("conv2d", conv_key, x, 0, call_key) is False  # the kept answer
    a, lw = torch.randn(5, 8), torch.randn(3, 8)
    assert kernels.torch_runs_linear(a, lw, None, 0) is False


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "conv_transpose2d"],
                         ids=[i for i in IDS if i != "conv_transpose2d"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "autocast-bf16"])
def test_run_op_direct_path_equals_the_dispatchers(case, amp):
    """run_op calls an op's autograd Function (and its autocast casts) itself for plain eager
    tensors: the result, its dtype and every gradient equal the torch.ops call's."""
    from dnnctl.torch.library import run_op

    name, op, args, _ = case
    ins = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor)
           and a.is_floating_point() else a for a in args]
    outs, grads = [], []
    for way in ("dispatcher", "direct"):
        leaves = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor)
                  else a for a in ins]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            y = op(*leaves) if way == "dispatcher" else run_op(op._qualified_op_name.split(
                "::")[1], *leaves)
        assert y.requires_grad and y.grad_fn is not None
        y.float().square().sum().backward()
        outs.append(y)
        grads.append([a.grad for a in leaves if isinstance(a, torch.Tensor)])
    assert outs[0].dtype == outs[1].dtype
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for g_disp, g_direct in zip(*grads):
        if g_disp is None:
            assert g_direct is None
        else:
            torch.testing.assert_close(g_direct, g_disp, rtol=0, atol=0)


def test_run_op_direct_path_records_the_forward_for_a_training_batch_norm():
    """The training batch_norm through run_op's direct path returns the functional op's
    five results and keeps the running statistics as they were."""
    from dnnctl.torch.library import run_op

    x = _r(4, 3, 5, 5).requires_grad_(True)
    rm, rv = torch.zeros(3), torch.ones(3)
    y, nm, nv, mean, invstd = run_op("batch_norm_train", x, rm, rv, None, None, 0.1, 1e-5, 0,
                                     "relu", None)
    want = F.relu(F.batch_norm(x, rm.clone(), rv.clone(), None, None, True, 0.1, 1e-5))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))
    torch.testing.assert_close(nm, 0.1 * x.detach().mean((0, 2, 3)))
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
