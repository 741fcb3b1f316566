"""torch CUDA tensors through the run-time pipeline: by pointer, on torch's current stream,
outputs from torch's caching allocator.

* every probe op gives bit for bit the same result on the default stream, on a user's side
  stream and inside a captured CUDA graph (replayed on new input values);
* outputs are torch tensors allocated by torch (they count in torch.cuda.memory_allocated);
* a second device, when present, runs there and leaves the caller's current device alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device for torch", allow_module_level=True)

import dnnctl.ops as ops  # noqa: E402

DEV = torch.device("cuda")
F16, BF16 = torch.float16, torch.bfloat16


def _probes() -> dict[str, tuple[list[Any], Callable[..., Any]]]:
    """name -> (inputs, fn(*inputs) -> output) over fresh random CUDA tensors."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int, dtype: Any = F16) -> Any:
        return torch.randn(*shape, device=DEV, dtype=torch.float32, generator=g).to(dtype)

    x_nhwc = r(8, 28, 28, 64)
    w_nhwc = r(64, 3, 3, 64)
    return {
        "softmax": ([r(64, 128)], lambda x: ops.softmax(x)),
        "layer_norm": ([r(64, 768), r(768), r(768)], lambda x, w, b: ops.layer_norm(x, w, b)),
        "rms_norm": ([r(33, 4096, dtype=BF16), r(4096, dtype=BF16)],
                     lambda x, w: ops.rms_norm(x, w)),
        "matmul": ([r(64, 64), r(64, 64)], lambda a, b: ops.matmul(a, b)),
        "linear_gelu": ([r(128, 768), r(3072, 768), r(3072)],
                        lambda a, w, b: ops.matmul(a, w.T, bias=b, activation="gelu")),
        "conv2d_nhwc": ([x_nhwc, w_nhwc], lambda x, w: ops.conv2d(x, w, padding=1,
                                                                  layout="NHWC")),
        "relu": ([r(64, 128)], lambda x: ops.relu(x)),
        "batch_norm": ([r(8, 64, 14, 14), r(64, dtype=torch.float32),
                        r(64, dtype=torch.float32).abs() + 0.5],
                       lambda x, m, v: ops.batch_norm(x, m, v)),
        "max_pool": ([r(8, 64, 28, 28)], lambda x: ops.max_pool2d(x, 3, 2, 1)),
        "global_avg_pool": ([r(8, 64, 7, 7)], lambda x: ops.global_avg_pool2d(x)),
    }


PROBES = list(_probes())


@pytest.mark.parametrize("name", PROBES)
def test_side_stream_and_graph_capture_are_bitwise_equal(name: str) -> None:
    inputs, fn = _probes()[name]
    ref = fn(*inputs)  # warm-up on the default stream: kernels built here, not in capture
    assert isinstance(ref, torch.Tensor) and ref.is_cuda
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            on_side = fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(on_side, ref), f"{name}: side stream differs"

    static = [t.clone() for t in inputs]
    graph = torch.cuda.CUDAGraph()
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn(*static)
    torch.cuda.current_stream().wait_stream(warm)
    with torch.cuda.graph(graph):
        captured = fn(*static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ref), f"{name}: graph replay differs"
    fresh = _probes()[name][0]  # new values into the static inputs: the replay follows
    for s, f in zip(static, fresh):
        s.copy_(f if f.dtype == s.dtype else f.to(s.dtype))
    graph.replay()
    want = fn(*static)
    torch.cuda.synchronize()
    assert torch.equal(captured, want), f"{name}: replay on new inputs differs"


def test_outputs_come_from_torchs_allocator() -> None:
    x = torch.randn(256, 1024, device=DEV, dtype=F16)
    ops.softmax(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = ops.softmax(x)
    assert torch.cuda.memory_allocated() - before >= y.numel() * y.element_size()
    ref = torch.softmax(x.float(), -1)
    assert float((y.float() - ref).abs().max()) < 2e-3


def test_nested_cupy_call_inside_a_torch_call_uses_torchs_allocator() -> None:
    """A composite op's recursion (calls on CuPy views of the caller's tensors, made inside
    the torch caller's context) takes its outputs from torch's allocator, not CuPy's pool
    (which may not grow under a graph capture), and leaves the caller's context as it was."""
    import cupy

    from dnnctl.backends import cuda
    from dnnctl.ops.dispatch import bind

    x = torch.randn(512, 1024, device=DEV, dtype=F16)
    bound = bind(x)
    pool = cupy.get_default_memory_pool()

    def inner(xc: Any) -> Any:
        alloc = cuda.STATE.alloc
        before_pool, before_torch = pool.used_bytes(), torch.cuda.memory_allocated()
        y = ops.softmax(xc)
        assert isinstance(y, cupy.ndarray)
        assert pool.used_bytes() == before_pool, "output came from CuPy's pool"
        assert torch.cuda.memory_allocated() - before_torch >= y.nbytes
        assert cuda.STATE.alloc is alloc, "the nested call did not restore the caller's state"
        return y

    y = bound.recurse(inner)
    assert isinstance(y, torch.Tensor) and cuda.STATE.alloc is None
    assert float((y.float() - torch.softmax(x.float(), -1)).abs().max()) < 2e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU")
def test_second_device_runs_there_and_restores_the_current_one() -> None:
    x = torch.randn(64, 128, device="cuda:1", dtype=F16)
    torch.cuda.set_device(0)
    y = ops.softmax(x)
    assert y.device == x.device and torch.cuda.current_device() == 0
    assert float((y.float() - torch.softmax(x.float(), -1)).abs().max()) < 2e-3


def test_deterministic_algorithms_pass_over_an_atomic_split_k_plan_entry() -> None:
    """torch.use_deterministic_algorithms(True): a plan entry naming the fp32-atomic split-K
    GEMM is passed over; repeated calls are bitwise equal and match torch."""
    from dnnctl.ops.base import Choice

    class AtomicPlan:
        def lookup(self, problem: Any, backend: str, device: Any) -> Any:
            return Choice.of("mma_atomic", {"splitk": 16}) if problem.op == "matmul" else None

    a = torch.randn(64, 16384, device=DEV, dtype=F16)
    b = torch.randn(16384, 64, device=DEV, dtype=F16)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        ys = [ops.matmul(a, b, plan=AtomicPlan()) for _ in range(4)]
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    ref = a.double() @ b.double()
    assert float((ys[0].double() - ref).abs().max()) < 0.05 * float(ref.abs().max())
