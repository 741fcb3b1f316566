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
