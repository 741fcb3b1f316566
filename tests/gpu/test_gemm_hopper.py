"""The fused-epilogue GEMM candidates on the GPU, beyond the registry sweep of test_gemm.py:

* ``cublaslt`` from torch tensors: on a side stream and captured in a CUDA graph (replayed
  on new inputs) bit for bit equal to the default stream; misaligned operands (the algorithm
  is chosen per alignment class); x @ W^T + bias + gelu against float64.
"""

from __future__ import annotations

import pytest

from dnnctl.ops.base import Choice
from dnnctl.ops.registry import get_op, get_variant

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device for torch", allow_module_level=True)

import dnnctl  # noqa: E402
from dnnctl.backends.registry import get_backend  # noqa: E402

OP = get_op("matmul")
DEV = torch.device("cuda")


class _Pin:
    """A plan that pins one variant (and its parameters) for every matmul call."""

    def __init__(self, variant: str, params: dict | None = None) -> None:
        self.choice = Choice.of(variant, params or {})

    def lookup(self, problem, backend, device):
        return self.choice if problem.op == "matmul" else None


def _supported(name: str, key: dict) -> None:
    dev = get_backend("cupy").device(0)
    why = get_variant("matmul", "cupy", name).supports(OP.problem(key), dev)
    if not why:
        pytest.skip(why.reason)


def _linear_ref(a, w, bias, act):
    y = a.double() @ w.double().t()
    if bias is not None:
        y = y + bias.double()
    if act == "gelu":
        y = torch.nn.functional.gelu(y)
    elif act == "relu":
        y = torch.relu(y)
    return y


@pytest.mark.parametrize("act", ["gelu", "relu", "none"])
def test_cublaslt_stream_and_graph_capture(act):
    m, n, k = 256, 3072, 768
    _supported("cublaslt", dict(m=m, n=n, k=k, dtype="bfloat16", trans_b=True, bias=True,
                                activation=act))
    g = torch.Generator(device=DEV).manual_seed(1)
    a = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device=DEV, generator=g) / k ** 0.5).to(torch.bfloat16)
    bias = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16)
    plan = _Pin("cublaslt")

    def fn(x, wt, b):
        return dnnctl.ops.matmul(x, wt.t(), bias=b, activation=act, plan=plan)

    ref = fn(a, w, bias)
    want = _linear_ref(a, w, bias, act)
    err = ((ref.double() - want).norm() / want.norm()).item()
    assert err < 8e-3, err
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = fn(a, w, bias)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(on_side, ref)
    static = [a.clone(), w.clone(), bias.clone()]
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn(*static)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ref)
    static[0].copy_(torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fn(*static))


def test_cublaslt_misaligned_batched_fp16():
    _supported("cublaslt", dict(batch=3, m=33, n=40, k=64, dtype="float16", bias=True,
                                activation="gelu"))
    g = torch.Generator(device=DEV).manual_seed(2)
    base = torch.randn(3 * 33 * 64 + 1, device=DEV, generator=g).to(torch.float16)
    a = base[1:].view(3, 33, 64)  # 2-byte offset
    assert a.data_ptr() % 16
    b = (torch.randn(3, 64, 40, device=DEV, generator=g) / 8).to(torch.float16)
    bias = torch.randn(40, device=DEV, generator=g).to(torch.float16)
    y = dnnctl.ops.matmul(a, b, bias=bias, activation="gelu", plan=_Pin("cublaslt"))
    want = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    err = ((y.double() - want).norm() / want.norm()).item()
    assert err < 2e-3, err


# ----------------------------------------------------------------------------- wgmma_tma

def _tp(bm, bn, cons, stages):
    return {"bm": bm, "bn": bn, "consumers": cons, "stages": stages}


TMA_CASES = [
    # m = 1 (a decode row), one consumer, 64 x 64 tiles, N tail
    (dict(m=1, n=200, k=4096, trans_b=True, bias=True, activation="gelu"), _tp(64, 64, 1, 3)),
    # k < 64 (one partial k-tile), M and N tails, MN-major a (trans_a)
    (dict(m=200, n=72, k=24, trans_a=True, bias=True), _tp(128, 64, 2, 5)),
    # batch > 1, both MN-major, relu, k-tiles wrap the ring several times
    (dict(batch=3, m=136, n=192, k=1000, trans_a=True, activation="relu"),
     _tp(128, 128, 2, 3)),
    # both K-major (x @ W^T), 128 x 256 with two consumers, tails on every side
    (dict(m=300, n=520, k=328, trans_b=True, bias=True, activation="gelu"),
     _tp(128, 256, 2, 4)),
    # row-major a, MN-major b, 256-row tiles (two m64 slices per consumer), silu
    (dict(m=520, n=264, k=200, activation="silu", bias=True), _tp(256, 128, 2, 4)),
    # persistent grid: 16 x 16 = 256 tiles over at most 132 blocks, 6 stages
    (dict(m=2048, n=2048, k=512, trans_b=True), _tp(128, 128, 2, 6)),
    # one consumer with 256-wide tiles, batch, 64-row tiles
    (dict(batch=2, m=64, n=512, k=128, bias=True), _tp(64, 256, 1, 4)),
    # one consumer, four m64 slices (256 x 64)
    (dict(m=256, n=64, k=192, trans_a=True, trans_b=True), _tp(256, 64, 1, 3)),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("key", "params"), TMA_CASES, ids=[f"tma{i}" for i in range(8)])
def test_wgmma_tma_edge_shapes(key, params, dtype):
    from dnnctl.ops.check import check_variant

    be = get_backend("cupy")
    dev = be.device(0)
    var = get_variant("matmul", "cupy", "wgmma_tma")
    problem = OP.problem(dict(key, dtype=dtype))
    why = var.supports(problem, dev)
    if not why:
        pytest.skip(why.reason)
    assert var.check_params(params) is None
    res = check_variant(OP, problem, var, params, be, dev, seed=17)
    assert res.ok, res.detail
    assert res.max_rel_err < OP.tolerance(problem, "y") / 2, res


def test_wgmma_tma_default_params_large_and_graph_capture():
    m, n, k = 1024, 4096, 1024
    _supported("wgmma_tma", dict(m=m, n=n, k=k, dtype="bfloat16", trans_b=True, bias=True,
                                 activation="gelu"))
    g = torch.Generator(device=DEV).manual_seed(3)
    a = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device=DEV, generator=g) / k ** 0.5).to(torch.bfloat16)
    bias = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16)
    plan = _Pin("wgmma_tma", _tp(128, 256, 2, 4))

    def fn(x, wt, b):
        return dnnctl.ops.matmul(x, wt.t(), bias=b, activation="gelu", plan=plan)

    ref = fn(a, w, bias)
    want = _linear_ref(a, w, bias, "gelu")
    assert ((ref.double() - want).norm() / want.norm()).item() < 8e-3
    static = [a.clone(), w.clone(), bias.clone()]
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn(*static)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ref)


def test_wgmma_tma_misaligned_operand_falls_back():
    _supported("wgmma_tma", dict(m=64, n=128, k=256, dtype="float16", bias=True))
    g = torch.Generator(device=DEV).manual_seed(4)
    base = torch.randn(64 * 256 + 1, device=DEV, generator=g).to(torch.float16)
    a = base[1:].view(64, 256)  # 2-byte offset: no tensor map possible
    b = (torch.randn(256, 128, device=DEV, generator=g) / 16).to(torch.float16)
    bias = torch.randn(128, device=DEV, generator=g).to(torch.float16)
    y = dnnctl.ops.matmul(a, b, bias=bias, plan=_Pin("wgmma_tma", _tp(64, 128, 1, 4)))
    want = a.double() @ b.double() + bias.double()
    assert ((y.double() - want).norm() / want.norm()).item() < 2e-3
