"""attention without a GPU: the key, mask semantics, the float64 reference against torch's
float64 autograd, the numpy variants, the public functions, the default heuristic, tune ->
plan -> dispatch on the numpy backend, and the CUDA variants' parameter spaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnctl
from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend
from dnnctl.errors import ShapeError, UnsupportedError, UsageError
from dnnctl.ops.attention.cupy_variants import smem_bytes
from dnnctl.ops.attention.op import allowed
from dnnctl.ops.check import check_variant
from dnnctl.ops.registry import get_op, get_variant, variants

OP = get_op("attention")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = DeviceInfo(backend="cupy", index=0, name="NVIDIA A100", compute_capability="8.0",
                  sm_count=108, smem_per_block_optin=163 * 1024)
V100 = DeviceInfo(backend="cupy", index=0, name="Tesla V100", compute_capability="7.0",
                  sm_count=80, smem_per_block_optin=96 * 1024)


def prob(**kw):
    return OP.problem(dict({"batch": 1, "heads_q": 2, "seq_q": 8, "head_dim": 16,
                            "dtype": "float16"}, **kw))


# ----------------------------------------------------------------------------- key


def test_key_defaults_and_canonical_forms():
    p = prob(seq_q=5)
    assert (p["heads_kv"], p["seq_kv"], p["head_dim_v"], p["pass"]) == (2, 5, 16, "forward")
    assert prob(causal="bottom_right")["causal"] == "top_left"  # square: the same mask
    assert prob(causal="bottom_right", seq_kv=9)["causal"] == "bottom_right"


@pytest.mark.parametrize(("kw", "words"), [
    (dict(heads_q=6, heads_kv=4), "multiple of heads_kv"),
    (dict(varlen=True), "BSHD"),
    (dict(varlen=True, layout="BSHD", batch=9), ">= batch"),
    (dict(paged=16, **{"pass": "backward"}), "paged"),
    (dict(softcap=-1.0), "softcap"),
    (dict(dtype="float32"), "not one of"),
    (dict(causal="lower"), "not one of"),
])
def test_bad_keys_name_the_problem(kw, words):
    with pytest.raises(UsageError, match=words):
        prob(**kw)


def test_mask_semantics():
    p = prob(causal="bottom_right", seq_q=2, seq_kv=4)
    assert allowed(p, 2, 4).astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    p = prob(causal="top_left", seq_q=2, seq_kv=4)
    assert allowed(p, 2, 4).astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    p = prob(window=1, seq_q=3, seq_kv=3)  # symmetric band without causal
    assert allowed(p, 3, 3).astype(int).tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    p = prob(window=1, causal="top_left", seq_q=3)
    assert allowed(p, 3, 3).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]


def test_flops_and_bytes():
    p = prob(batch=4, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16")
    assert OP.flops(p) == 4 * 4 * 32 * 4096 * 4096 * 128
    assert OP.flops(prob(batch=4, heads_q=32, seq_q=4096, head_dim=128,
                         causal="top_left")) == OP.flops(p) / 2
    assert OP.flops(prob(**{"pass": "backward"})) == 2.5 * OP.flops(prob())
    d = prob(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128)
    kv = 2 * 8 * 8 * 4096 * 128 * 2
    assert kv < OP.min_bytes(d) < kv * 1.01  # decode streams the KV cache


# ----------------------------------------------------------------------------- reference


def _torch_ref(p, ins, scale):
    torch = pytest.importorskip("torch")
    g = p["heads_q"] // p["heads_kv"]
    q = torch.tensor(ins["q"].astype(np.float64), requires_grad=True)
    k = torch.tensor(ins["k"].astype(np.float64), requires_grad=True)
    v = torch.tensor(ins["v"].astype(np.float64), requires_grad=True)
    s = scale * q @ k.repeat_interleave(g, dim=1).transpose(-1, -2)
    if p["softcap"]:
        s = p["softcap"] * torch.tanh(s / p["softcap"])
    s = s.masked_fill(~torch.tensor(allowed(p, p["seq_q"], p["seq_kv"])), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ v.repeat_interleave(g, dim=1)
    return q, k, v, out, lse


@pytest.mark.parametrize("kw", [
    dict(heads_q=4, heads_kv=2, seq_q=7, seq_kv=11),
    dict(causal="bottom_right", seq_q=5, seq_kv=9, softcap=2.0),
    dict(causal="top_left", window=2, seq_q=9, head_dim_v=8),
])
def test_reference_matches_torch_float64_autograd(kw):
    torch = pytest.importorskip("torch")
    p = prob(**kw)
    rng = np.random.default_rng(0)
    ins = OP.make_inputs(p, rng)
    scale = 0.3
    q, k, v, out, lse = _torch_ref(p, ins, scale)
    ref = OP.reference(p, ins, {"scale": scale})
    np.testing.assert_allclose(ref["out"], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref["lse"], lse.detach().numpy(), rtol=1e-12)
    dout = rng.standard_normal(out.shape)
    out.backward(torch.tensor(dout))
    bwd = OP.problem(dict(p.key, **{"pass": "backward"}))
    grads = OP.reference(bwd, dict(ins, out=ref["out"], lse=ref["lse"], dout=dout),
                         {"scale": scale})
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        np.testing.assert_allclose(grads[name], t.grad.numpy(), rtol=1e-9, atol=1e-11)


def test_rows_without_keys_give_zero_and_minus_inf():
    p = prob(causal="bottom_right", seq_q=6, seq_kv=3)  # queries 0..2 see no key
    ref = OP.reference(p, OP.make_inputs(p, np.random.default_rng(1)), {})
    assert np.all(ref["out"][:, :, :3] == 0) and np.all(np.isneginf(ref["lse"][:, :, :3]))
    assert np.all(np.isfinite(ref["lse"][:, :, 3:]))


# ----------------------------------------------------------------------------- numpy


NUMPY_CASES = [
    dict(batch=2, heads_q=4, heads_kv=2, seq_q=33, seq_kv=47, head_dim=16),
    dict(heads_q=2, seq_q=70, head_dim=8, dtype="bfloat16", causal="top_left", layout="BSHD"),
    dict(batch=2, seq_q=20, seq_kv=9, head_dim=8, causal="bottom_right", window=3,
         softcap=5.0),
    dict(batch=3, heads_q=4, heads_kv=1, seq_q=50, seq_kv=70, head_dim=8, head_dim_v=12,
         varlen=True, layout="BSHD", causal="bottom_right"),
    dict(batch=3, heads_q=4, heads_kv=2, seq_q=2, seq_kv=100, head_dim=8, paged=16),
    dict(seq_q=300, seq_kv=300, head_dim=8, causal="top_left", window=50),
]


@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("case", range(len(NUMPY_CASES)))
def test_numpy_variants_against_reference(case, pass_):
    key = dict(NUMPY_CASES[case], **{"pass": pass_})
    if pass_ == "backward" and key.get("paged"):
        pytest.skip("paged caches are forward only")
    p = prob(**key)
    be = get_backend("numpy")
    ran = 0
    for v in variants("attention", "numpy"):
        if not v.supports(p, be.device(0)):
            continue
        for params in v.param_space(p, be.device(0)):
            res = check_variant(OP, p, v, params, be, be.device(0), seed=case)
            assert res.ok, f"{v.name} {params}: {res.detail}"
            ran += 1
    assert ran >= (1 if pass_ == "backward" else 2)


def test_blocked_skips_masked_blocks_and_keeps_bounded_blocks():
    v = get_variant("attention", "numpy", "blocked")
    assert "backward" in v.supports(prob(**{"pass": "backward"}), None).reason
    space = list(v.param_space(prob(seq_q=100, seq_kv=100), None))
    assert {"block_q": 64, "block_kv": 64} in space and all(
        s["block_kv"] < 100 or s["block_kv"] == 64 for s in space)


# ----------------------------------------------------------------------------- function


def _qkv(rng, shape_q, shape_kv, dtype=np.float16):
    return (rng.standard_normal(shape_q).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


def test_public_function_on_numpy():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (2, 4, 9, 16), (2, 2, 12, 16))
    out, lse = dnnctl.ops.attention(q, k, v, causal="bottom_right", return_lse=True)
    p = OP.problem(batch=2, heads_q=4, heads_kv=2, seq_q=9, seq_kv=12, head_dim=16,
                   dtype="float16", causal="bottom_right")
    ref = OP.reference(p, {"q": q, "k": k, "v": v}, {})
    assert out.dtype == np.float16 and out.shape == (2, 4, 9, 16)
    assert np.linalg.norm(out - ref["out"]) / np.linalg.norm(ref["out"]) < 4e-3
    np.testing.assert_allclose(lse, ref["lse"], rtol=1e-5)
    # BSHD: the same numbers from the transposed storage
    y = dnnctl.ops.attention(np.ascontiguousarray(q.transpose(0, 2, 1, 3)),
                             np.ascontiguousarray(k.transpose(0, 2, 1, 3)),
                             np.ascontiguousarray(v.transpose(0, 2, 1, 3)),
                             causal="bottom_right", layout="BSHD")
    np.testing.assert_array_equal(y.transpose(0, 2, 1, 3), out)
    dq, dk, dv = dnnctl.ops.attention_backward(np.ones_like(out), q, k, v, out, lse,
                                               causal="bottom_right")
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    np.testing.assert_allclose(dv.astype(np.float32).sum(), 2 * 4 * 9 * 16, rtol=1e-2)


def test_public_function_varlen_paged_and_torch_cpu():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, (10, 4, 8), (13, 2, 8))
    cq, ck = np.array([0, 4, 10], np.int32), np.array([0, 6, 13], np.int32)
    y = dnnctl.ops.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    first = dnnctl.ops.attention(q[None, :4], k[None, :6], v[None, :6], layout="BSHD")
    np.testing.assert_allclose(y[:4].astype(np.float32), first[0].astype(np.float32),
                               atol=2e-3)
    pages = rng.standard_normal((4, 16, 2, 8)).astype(np.float16)
    table = np.array([[2, 0], [1, 3]], np.int32)
    used = np.array([20, 7], np.int32)
    qd = rng.standard_normal((2, 4, 1, 8)).astype(np.float16)
    yd = dnnctl.ops.attention(qd, pages, pages, block_table=table, seqused_k=used)
    kv0 = np.concatenate([pages[2], pages[0]])[:20].transpose(1, 0, 2)[None]
    want = dnnctl.ops.attention(qd[:1], kv0, kv0)
    np.testing.assert_allclose(yd[:1].astype(np.float32), want.astype(np.float32), atol=2e-3)
    # a shared pool larger than the batch's pages (as a serving engine keeps one), pages
    # in any order: the same result
    pool = np.zeros((9, 16, 2, 8), np.float16)
    pool[[7, 5, 1, 8]] = pages[[2, 0, 1, 3]]
    big = dnnctl.ops.attention(qd, pool, pool, block_table=np.array([[7, 5], [1, 8]], np.int32),
                               seqused_k=used)
    np.testing.assert_array_equal(big, yd)
    with pytest.raises(ShapeError, match="names page 9; the pool"):
        dnnctl.ops.attention(qd, pool, pool, block_table=np.array([[7, 5], [1, 9]], np.int32),
                             seqused_k=used)
    with pytest.raises(ShapeError, match="length 33; each must be in 1 .. 32"):
        dnnctl.ops.attention(qd, pages, pages, block_table=table,
                             seqused_k=np.array([33, 7], np.int32))
    with pytest.raises(ShapeError, match="block_table has dtype int64"):
        dnnctl.ops.attention(qd, pages, pages, block_table=table.astype(np.int64),
                             seqused_k=used)
    with pytest.raises(ShapeError, match="v's page pool"):
        dnnctl.ops.attention(qd, pages, pages[:3], block_table=table, seqused_k=used)
    torch = pytest.importorskip("torch")
    t = dnnctl.ops.attention(*(torch.from_numpy(x) for x in (q[None], k[None], v[None])),
                             layout="BSHD")
    assert isinstance(t, torch.Tensor) and t.shape == (1, 10, 4, 8)


def test_public_function_errors_name_the_argument():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(ShapeError, match="k has dtype float32"):
        dnnctl.ops.attention(q, k.astype(np.float32), v)
    with pytest.raises(UsageError, match="causal='diagonal'"):
        dnnctl.ops.attention(q, k, v, causal="diagonal")
    with pytest.raises(ShapeError, match="expected 4 dimensions"):
        dnnctl.ops.attention(q[0], k, v)
    with pytest.raises(UsageError, match="cu_seqlens_k"):
        dnnctl.ops.attention(q[0], k[0], v[0], cu_seqlens_q=np.array([0, 2], np.int32))
    with pytest.raises(ShapeError, match="float16 or bfloat16"):
        dnnctl.ops.attention(q.astype(np.float32), k, v)


# ----------------------------------------------------------------------------- heuristic


def test_default_heuristic_is_a_small_cost_rule(monkeypatch):
    from dnnctl.backends import tma

    decode = prob(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128)
    prefill = prob(batch=4, heads_q=32, seq_q=4096, head_dim=128)
    monkeypatch.setattr(tma, "available", lambda: True)
    # decode: the copy-engine kernel on sm_90 (no tensor maps needed), else the mma one
    assert OP.default_choice(decode, "cupy", H200).variant == "decode_ring"
    assert OP.default_choice(decode, "cupy", A100).variant == "decode"
    # Hopper, TMA: cuDNN through torch where this torch has CUDA, else our Hopper kernel
    vendor = get_variant("attention", "cupy", "torch_cudnn").supports(prefill, H200)
    assert OP.default_choice(prefill, "cupy", H200).variant == (
        "torch_cudnn" if vendor else "wgmma")
    paged = prob(batch=2, heads_q=8, seq_q=64, seq_kv=1024, head_dim=128, paged=64)
    assert OP.default_choice(paged, "cupy", H200).variant == "mma"
    monkeypatch.setattr(tma, "available", lambda: False)  # a driver without tensor maps
    assert OP.default_choice(decode, "cupy", H200).variant == "decode_ring"
    assert OP.default_choice(prefill, "cupy", H200).variant == (
        "torch_cudnn" if vendor else "mma")
    assert OP.default_choice(prefill, "cupy", A100).variant == "mma"
    assert OP.default_choice(prefill, "numpy", None).variant == "blocked"
    assert OP.default_choice(prob(**{"pass": "backward"}), "numpy", None).variant == "whole"
    short_kv = prob(seq_q=1, seq_kv=64, head_dim=64)
    assert OP.default_choice(short_kv, "cupy", A100).variant == "mma"
    # where torch has CUDA, cuDNN through torch leads on sm_90 (for GQA where this torch's
    # cuDNN op takes it, >= 2.11; not for decode); elsewhere the order above stands
    cudnn = get_variant("attention", "cupy", "torch_cudnn")
    monkeypatch.setattr(type(cudnn), "supports", lambda self, p, d: self.more(p))
    monkeypatch.setattr(tma, "available", lambda: True)
    assert OP.default_choice(prefill, "cupy", H200).variant == "torch_cudnn"
    assert OP.default_choice(prefill, "cupy", A100).variant == "mma"
    from dnnctl.ops.attention import vendor

    assert OP.default_choice(decode, "cupy", H200).variant == (
        "torch_cudnn" if vendor._cudnn_takes_gqa() else "decode_ring")
    assert OP.default_choice(decode, "cupy", A100).variant == "decode"
    paged_decode = prob(batch=2, heads_q=8, heads_kv=2, seq_q=1, seq_kv=1024, head_dim=128,
                        paged=16)
    assert OP.default_choice(paged_decode, "cupy", H200).variant == "decode_ring"
    gqa = prob(batch=2, heads_q=8, heads_kv=2, seq_q=512, head_dim=128)
    assert OP.default_choice(gqa, "cupy", H200).variant == (
        "torch_cudnn" if vendor._cudnn_takes_gqa() else "wgmma")
    bwd = get_variant("attention", "cupy", "torch_cudnn_bwd")
    assert not bwd.more(prob(**{"pass": "backward", "heads_q": 8, "heads_kv": 2}))
    assert not cudnn.more(prob(heads_q=8, heads_kv=2, layout="BSHD"))  # GQA: BHSD only
    monkeypatch.undo()
    if not get_variant("attention", "cupy", "torch_flash").supports(prefill, V100):
        with pytest.raises(UnsupportedError, match="no registered attention variant"):
            OP.default_choice(prefill, "cupy", V100)


def test_cuda_spaces_fit_the_device():
    mma = get_variant("attention", "cupy", "mma")
    dec = get_variant("attention", "cupy", "decode")
    for d in (64, 96, 128, 256):
        p = prob(batch=4, heads_q=32, seq_q=4096, head_dim=d)
        space = list(mma.param_space(p, A100))
        assert space and mma.default_params(p, A100) in space
        for params in space:
            assert smem_bytes(p, params["bm"], params["bn"]) <= 163 * 1024
            assert params["wm"] // 16 * (d // 2 + params["bn"] // 2) <= 192
    p = prob(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128)
    dp = dec.default_params(p, H200)
    assert dp["bm"] == 16 and dp["splits"] > 1  # 64 blocks: split until 2 waves
    assert dec.workspace_bytes(p, dp) == 4 * dp["splits"] * 8 * 32 * 129
    assert "exceed" in dec.supports(prob(heads_q=32, heads_kv=1, seq_q=4, head_dim=64), H200).reason
    assert "head_dim" in mma.supports(prob(head_dim=72), H200).reason
    assert "8.0" in mma.supports(prob(), V100).reason
    assert all(v.vendor for v in variants("attention", "cupy") if v.name.startswith("torch"))
    assert not mma.vendor


# ----------------------------------------------------------------------------- tune


def test_tune_plan_dispatch_on_numpy(tmp_path, monkeypatch):
    from dnnctl.plan import read_plan
    from dnnctl.tune.timer import TimingPolicy
    from dnnctl.tune.tuner import TuneOptions, tune
    from dnnctl.workloads import Workload

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    wl = Workload("attn")
    key = dict(batch=1, heads_q=4, heads_kv=2, seq_q=200, seq_kv=200, head_dim=32,
               dtype="float16", causal="top_left")
    prob_ = wl.add("attention", key)
    policy = TimingPolicy.for_backend("numpy").replace(warmup_ms=1.0, budget_ms=6.0,
                                                       retime_budget_ms=4.0)
    report = tune(wl, TuneOptions(device="cpu", output=tmp_path / "plan.yaml", policy=policy))
    assert [o.status for o in report.outcomes] == ["planned"]
    entry = read_plan(tmp_path / "plan.yaml").sections[0].find(prob_)
    assert entry.choice.variant in {"whole", "blocked"} and entry.tried >= 3
    plan = dnnctl.load_plan(tmp_path / "plan.yaml")
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (1, 4, 200, 32), (1, 2, 200, 32))
    with dnnctl.use_plan(plan):
        dnnctl.ops.attention(q, k, v, causal=True)
    assert plan.stats().hits == {prob_: 1}


@pytest.mark.parametrize(("version", "takes"), [("2.11.0+cu130", True), ("2.13.1", True),
                                                ("2.10.2+cu128", False), ("3.0", True),
                                                ("nightly", False)])
def test_cudnn_gqa_by_torch_version(monkeypatch, version, takes):
    torch = pytest.importorskip("torch")
    from dnnctl.ops.attention import vendor

    monkeypatch.setattr(torch, "__version__", version)
    vendor._cudnn_takes_gqa.cache_clear()
    try:
        assert vendor._cudnn_takes_gqa() is takes
    finally:
        vendor._cudnn_takes_gqa.cache_clear()


@pytest.mark.parametrize("layout", ["BHSD", "BSHD"])
@pytest.mark.parametrize("case", ["k_batch", "v_heads", "v_length", "kv_heads_over_q"])
def test_q_k_v_that_do_not_agree_are_refused(layout, case):
    """A k / v of another batch, head count or length was read in part (the first batches
    of a larger k): the shapes must agree, else a ShapeError names the tensor."""
    import dnnctl.ops as o

    rng = np.random.default_rng(0)

    def t(b, h, s, d):
        shape = (b, h, s, d) if layout == "BHSD" else (b, s, h, d)
        return rng.standard_normal(shape).astype(np.float16)

    q, k, v = t(2, 4, 9, 16), t(2, 2, 11, 16), t(2, 2, 11, 16)
    assert o.attention(q, k, v, layout=layout).shape == q.shape  # grouped-query: fine
    bad = {"k_batch": (q, t(3, 2, 11, 16), t(3, 2, 11, 16)),
           "v_heads": (q, k, t(2, 4, 11, 16)),
           "v_length": (q, k, t(2, 2, 12, 16)),
           "kv_heads_over_q": (t(2, 2, 9, 16), t(2, 4, 11, 16), t(2, 4, 11, 16))}[case]
    with pytest.raises(ShapeError):
        o.attention(*bad, layout=layout)


def test_backward_refuses_an_lse_of_another_shape():
    import dnnctl.ops as o

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in
               ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    out, lse = o.attention(q, k, v, return_lse=True)
    with pytest.raises(ShapeError, match="lse"):
        o.attention_backward(np.ones_like(out), q, k, v, out, lse[:, :1])


@pytest.mark.parametrize("kw", [{"scale": "a"}, {"softcap": "x"}, {"window": 2.5},
                                {"window": True}, {"window": -1}])
def test_scalar_arguments_that_are_not_numbers_are_usage_errors(kw):
    import dnnctl.ops as o

    q = np.ones((1, 2, 4, 8), np.float16)
    with pytest.raises(UsageError):
        o.attention(q, q, q, **kw)


@pytest.mark.parametrize("path", [None, 123])
def test_load_plan_of_something_that_is_not_a_path(path):
    with pytest.raises(UsageError, match="path of a plan file"):
        dnnctl.load_plan(path)
