"""attention on the GPU: every registered cupy variant (ours and the vendors' where installed)
x dtype x mask x layout against the float64 reference on fresh random inputs with
NaN-poisoned outputs: seq 1, odd lengths (1000, 197), head dims 64 / 96 / 128 / 256, GQA
8:1, varlen batches, paged caches, windows and softcap; the backward against float64; the
public function on CuPy arrays and torch tensors.

Each case checks the variant's default parameters and, on odd cases, one seeded sample of
its space (NVRTC compiles bound the run; use -n 8).
"""

from __future__ import annotations

import datetime
import random

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.check import check_variant
from dnnctl.ops.registry import get_op, get_variant, variants

OP = get_op("attention")

CASES: list[tuple[str, dict]] = [
    ("seq1", dict(batch=1, heads_q=4, seq_q=1, seq_kv=1, head_dim=64)),
    ("odd1000_causal", dict(batch=1, heads_q=4, seq_q=1000, head_dim=128, causal="top_left")),
    ("odd197_bshd_d96", dict(batch=2, heads_q=3, seq_q=197, head_dim=96, layout="BSHD")),
    ("d256_bottom_right", dict(batch=1, heads_q=2, seq_q=300, seq_kv=517, head_dim=256,
                               causal="bottom_right", layout="BSHD")),
    ("d256_top_left", dict(batch=1, heads_q=2, seq_q=300, seq_kv=517, head_dim=256,
                           causal="top_left")),
    ("gqa8_bhsd", dict(batch=2, heads_q=16, heads_kv=2, seq_q=129, seq_kv=300,
                       head_dim=128)),
    ("gqa8_causal_bshd", dict(batch=1, heads_q=8, heads_kv=1, seq_q=257, head_dim=64,
                              causal="top_left", layout="BSHD")),
    ("window_softcap", dict(batch=1, heads_q=4, seq_q=333, head_dim=128, causal="top_left",
                            window=64, softcap=30.0)),
    ("window_none", dict(batch=1, heads_q=2, seq_q=200, seq_kv=250, head_dim=64, window=40)),
    ("varlen_gqa", dict(batch=4, heads_q=8, heads_kv=2, seq_q=700, seq_kv=900, head_dim=128,
                        causal="bottom_right", layout="BSHD", varlen=True)),
    ("varlen_none", dict(batch=3, heads_q=4, seq_q=500, seq_kv=500, head_dim=64,
                         layout="BSHD", varlen=True)),
    ("decode_gqa", dict(batch=4, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128)),
    ("decode_q5", dict(batch=2, heads_q=8, seq_q=5, seq_kv=1000, head_dim=64,
                       causal="bottom_right", layout="BSHD")),
    ("paged256", dict(batch=3, heads_q=16, heads_kv=4, seq_q=1, seq_kv=2048, head_dim=128,
                      paged=256)),
    ("paged16_causal", dict(batch=2, heads_q=8, heads_kv=2, seq_q=4, seq_kv=777, head_dim=64,
                            paged=16, causal="bottom_right")),
    ("square_2048", dict(batch=1, heads_q=8, seq_q=2048, head_dim=128, causal="top_left")),
]
BACKWARD: list[tuple[str, dict]] = [
    ("bwd_small", dict(batch=2, heads_q=4, seq_q=97, seq_kv=97, head_dim=64)),
    ("bwd_causal_gqa", dict(batch=1, heads_q=8, heads_kv=2, seq_q=300, head_dim=128,
                            causal="top_left", layout="BSHD")),
    ("bwd_varlen", dict(batch=3, heads_q=4, seq_q=400, seq_kv=400, head_dim=64,
                        causal="bottom_right", layout="BSHD", varlen=True)),
    ("bwd_d96_window_softcap", dict(batch=1, heads_q=2, seq_q=197, seq_kv=333, head_dim=96,
                                    causal="bottom_right", window=50, softcap=30.0)),
    ("bwd_dv64_gqa4_1000", dict(batch=1, heads_q=4, heads_kv=1, seq_q=1000, head_dim=128,
                                head_dim_v=64)),
]
DTYPES = ("float16", "bfloat16")


def _names(pass_: str) -> list[str]:
    return [v.name for v in variants("attention", "cupy") if pass_ in v.passes]


@pytest.fixture(scope="module")
def gpu():
    be = get_backend("cupy")
    return be, be.device(0)


def _params(variant, problem, dev, i: int):
    own = getattr(variant, "default_params", None)
    if i % 2 == 0 or not variant.params:
        return own(problem, dev) if own else next(iter(variant.param_space(problem, dev)),
                                                  None)
    space = list(variant.param_space(problem, dev))
    return random.Random(i).choice(space) if space else None


def _check(gpu, name: str, key: dict, dtype: str, i: int) -> None:
    be, dev = gpu
    variant = next(v for v in variants("attention", "cupy") if v.name == name)
    p = OP.problem(dict(key, dtype=dtype))
    ok = variant.supports(p, dev)
    if not ok:
        pytest.skip(ok.reason)
    params = _params(variant, p, dev, i)
    if params is None:
        pytest.skip("no legal parameters")
    res = check_variant(OP, p, variant, params, be, dev, seed=i)
    assert res.ok, f"{name} {params} {p.short()}: {res.detail}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
@pytest.mark.parametrize("name", _names("forward"))
def test_forward_against_float64(gpu, name, case, dtype):
    _check(gpu, name, CASES[case][1], dtype, case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(BACKWARD)), ids=[c[0] for c in BACKWARD])
@pytest.mark.parametrize("name", _names("backward"))
def test_backward_against_float64(gpu, name, case, dtype):
    _check(gpu, name, dict(BACKWARD[case][1], **{"pass": "backward"}), dtype, case)


def test_public_function_on_cupy_and_torch(gpu):
    import cupy

    import dnnctl

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 8, 300, 64)).astype(np.float16)
    k = rng.standard_normal((2, 2, 300, 64)).astype(np.float16)
    v = rng.standard_normal((2, 2, 300, 64)).astype(np.float16)
    ref = OP.reference(OP.problem(batch=2, heads_q=8, heads_kv=2, seq_q=300, head_dim=64,
                                  dtype="float16", causal="top_left"),
                       {"q": q, "k": k, "v": v}, {})
    out, lse = dnnctl.ops.attention(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v),
                                    causal=True, return_lse=True)
    assert isinstance(out, cupy.ndarray)
    err = np.linalg.norm(cupy.asnumpy(out).astype(np.float64) - ref["out"]) / np.linalg.norm(
        ref["out"])
    assert err < 4e-3
    np.testing.assert_allclose(cupy.asnumpy(lse), ref["lse"], rtol=1e-4, atol=1e-4)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    y = dnnctl.ops.attention(tq, tk, tv, causal=True)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                            enable_gqa=True)
    assert torch.allclose(y.float(), want.float(), atol=2e-3, rtol=2e-3)
    # BSHD views of a BHSD tensor: a transposed (non-contiguous) view is copied, not misread
    y2 = dnnctl.ops.attention(tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2),
                              causal=True, layout="BSHD")
    assert torch.allclose(y2.transpose(1, 2).float(), want.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("variant", ["torch_cudnn", "torch_flash", "wgmma"])
def test_packed_qkv_views_from_torch(gpu, variant):
    """ViT's q, k, v: views of one packed (B, S, 3, H, D) projection. torch's SDPA backends
    (strided_io) read them as they are and return out in torch's own (B, S, H, D) memory,
    so the model's transpose + reshape costs no copy; dnnctl's own kernel gets dense copies.
    Every way equals torch's SDPA on the same views."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import dnnctl
    from dnnctl.ops.base import Choice
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest

    _, dev = gpu
    b, s, h, d = 2, 197, 4, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.float16, generator=gen)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    key = dict(batch=b, heads_q=h, heads_kv=h, seq_q=s, seq_kv=s, head_dim=d, head_dim_v=d,
               dtype="float16")
    problem = OP.problem(key)
    var = get_variant("attention", "cupy", variant)
    if not var.supports(problem, dev):
        pytest.skip(f"{variant} does not take this problem here")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = LoadedPlan(Plan([Section(dev.fingerprint(), kernels_digest(), now, {},
                                    [PlanEntry(problem, Choice.of(variant))])]))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = dnnctl.ops.attention(q, k, v, plan=plan)
    assert out.shape == want.shape
    assert torch.allclose(out.float(), want.float(), atol=3e-3, rtol=3e-3)
    if variant.startswith("torch_"):
        assert out.stride() == want.stride()  # torch's layout, not a dense copy


VENDOR_CALLS: list[tuple[str, dict]] = [
    ("torch_cudnn", dict(batch=2, heads_q=8, heads_kv=2, seq_q=1, seq_kv=1000, head_dim=128)),
    ("torch_cudnn", dict(batch=2, heads_q=4, seq_q=197, head_dim=64, causal="top_left")),
    ("torch_flash", dict(batch=2, heads_q=8, heads_kv=2, seq_q=129, seq_kv=300, head_dim=64,
                         causal="bottom_right", layout="BSHD")),
    ("torch_efficient", dict(batch=1, heads_q=4, seq_q=300, head_dim=96)),
    ("torch_cudnn_bwd", dict(batch=1, heads_q=4, seq_q=257, head_dim=64, causal="top_left",
                             **{"pass": "backward"})),
    ("torch_flash_bwd", dict(batch=1, heads_q=8, heads_kv=2, seq_q=200, head_dim=64,
                             layout="BSHD", **{"pass": "backward"})),
]


@pytest.mark.parametrize("case", range(len(VENDOR_CALLS)),
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(VENDOR_CALLS)])
def test_planned_vendor_call_adopts_outputs_on_any_stream(gpu, case):
    """A plan that picks a vendor wrapper, called from torch tensors: the wrapper gets the
    tensors as they are and returns the library's own outputs (no copy into ours). The
    result matches float64; on a side stream it equals the default stream's; captured in a
    CUDA graph it replays on new inputs."""
    import datetime

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import dnnctl
    from dnnctl.ops import dispatch
    from dnnctl.ops.base import Choice
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest

    be, dev = gpu
    name, key = VENDOR_CALLS[case]
    p = OP.problem(dict(key, dtype="float16"))
    variant = next(v for v in variants("attention", "cupy") if v.name == name)
    ok = variant.supports(p, dev)
    if not ok:
        pytest.skip(ok.reason)
    assert dispatch.adopting(variant.build(p, {}, dev))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = LoadedPlan(Plan([Section(dev.fingerprint(), kernels_digest(), now, {},
                                    [PlanEntry(p, Choice.of(name))])]))
    host = OP.make_inputs(p, np.random.default_rng(case))
    ref = OP.reference(p, {k: v.astype(np.float64) for k, v in host.items()}, {})
    t = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
    bwd = p["pass"] == "backward"
    kw = dict(causal=p["causal"], layout=p["layout"], plan=plan)

    def call():
        if bwd:
            return dnnctl.ops.attention_backward(t["dout"], t["q"], t["k"], t["v"], t["out"],
                                                 t["lse"], **kw)
        return dnnctl.ops.attention(t["q"], t["k"], t["v"], return_lse=True, **kw)

    names = ("dq", "dk", "dv") if bwd else ("out", "lse")
    got = call()
    for n, g in zip(names, got):
        # a forward's out may keep torch's (B, S, H, D) memory (strided_io), as SDPA's does
        assert g.is_cuda and tuple(g.shape) == ref[n].shape
        assert g.is_contiguous() or (n == "out" and p["layout"] == "BHSD")
        err = np.linalg.norm(g.double().cpu().numpy() - ref[n]) / np.linalg.norm(ref[n])
        assert err < 2e-2, f"{name} {n}: rel err {err:.3g}"
    assert plan.stats().hits.get(p, 0) == 1
    exact = not bwd  # the vendors' backward accumulates in no fixed order
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for a, b in zip(got, on_side):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        call()  # warm on the capture's stream
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = call()
    fresh = OP.make_inputs(p, np.random.default_rng(case + 100))
    for k, v in fresh.items():
        if k in ("q", "k", "v", "dout"):
            t[k].copy_(torch.from_numpy(v))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, call()):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-2, rtol=1e-2)
