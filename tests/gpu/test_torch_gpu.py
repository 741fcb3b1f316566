"""dnnctl.torch on a CUDA device: patched models equal eager; a user's side stream and a CUDA
graph capture give bit for bit the default stream's results; torch.compile(fullgraph=True)
traces patched modules; every torch.ops.dnnctl op runs on dnnctl (no torch fallback).

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_torch_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
dt = pytest.importorskip("dnnctl.torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _torch_models import Bottleneck, LlamaBlock, SmallResNet, ViTBlock  # noqa: E402
from _torch_models import bn_stats as _bn_stats  # noqa: E402
from torch import nn  # noqa: E402

CL = torch.channels_last



def _models():
    """(name, model on cuda in its dtype / format, input, relative tolerance)."""
    torch.manual_seed(0)
    dev = "cuda"
    resnet = _bn_stats(SmallResNet()).eval().to(dev, torch.float16).to(memory_format=CL)
    x_r = torch.randn(4, 3, 32, 32, device=dev, dtype=torch.float16).contiguous(
        memory_format=CL)
    vit = ViTBlock(64, 4).eval().to(dev, torch.float16)
    llama = LlamaBlock(64, 4, 176).eval().to(dev, torch.bfloat16)
    # ResNet-50's tail at batch 1: a split-K GEMM whose tile counters are kept per stream
    # (a capture's stream is new to it: counters of that call only, from the graph's pool)
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    head = head.eval().to(dev, torch.float16)
    x_h = torch.randn(1, 2048, 7, 7, device=dev, dtype=torch.float16).contiguous(
        memory_format=CL)
    return [
        ("classifier head fp16", head, x_h, 2e-2),
        ("resnet fp16 channels_last", resnet, x_r, 2e-2),
        ("resnet fp32", _bn_stats(SmallResNet()).eval().to(dev),
         torch.randn(2, 3, 32, 32, device=dev), 1e-3),
        ("vit fp16", vit, torch.randn(2, 17, 64, device=dev, dtype=torch.float16), 2e-2),
        ("llama bf16", llama, torch.randn(2, 16, 64, device=dev, dtype=torch.bfloat16), 4e-2),
    ]


MODELS = _models()
IDS = [m[0] for m in MODELS]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("case", MODELS, ids=IDS)
def test_patched_model_equals_eager_on_cuda(case):
    _, model, x, tol = case
    with torch.inference_mode():
        want = model(x)
        with dt.patched(model) as report:
            got = model(x)
    # every module op ran on dnnctl (attention, where routed, may decline a head size)
    assert [k for k in report.fallbacks() if k[0] != "attention"] == [], report.fallbacks()
    assert _rel(got, want) <= tol


@pytest.mark.parametrize("case", MODELS, ids=IDS)
def test_side_stream_is_bitwise_the_default_stream(case):
    _, model, x, _ = case
    with torch.inference_mode(), dt.patched(model):
        want = model(x)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # queue work behind work on the side stream
                got = model(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", MODELS, ids=IDS)
def test_cuda_graph_capture_replays_bitwise(case):
    _, model, x, _ = case
    with torch.inference_mode(), dt.patched(model):
        want = model(x)
        static_x = x.clone()
        warm = torch.cuda.Stream()  # torch's recipe: warm up on a side stream first
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            for _ in range(2):
                model(static_x)
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        x2 = torch.randn_like(x)
        want2 = model(x2)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, want)
        static_x.copy_(x2)  # a replay follows the input's new data
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, want2)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_over_patched_modules(mode):
    torch.manual_seed(0)
    model = _bn_stats(Bottleneck(32, 8)).eval().cuda().half().to(memory_format=CL)
    x = torch.randn(4, 32, 14, 14, device="cuda", dtype=torch.float16).contiguous(
        memory_format=CL)
    with torch.inference_mode(), dt.patched(model) as report:
        want = model(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, mode=mode)
        for _ in range(3):
            got = compiled(x)
    assert report.fusions and report.fallbacks() == {}
    assert _rel(got, want) <= 1e-2


def test_training_step_on_cuda_matches_torch():
    torch.manual_seed(0)
    ref = SmallResNet().cuda().train()
    model = SmallResNet().cuda().train()
    model.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 16, 16, device="cuda")
    ref(x).square().mean().backward()
    with dt.patched(model) as report:
        model(x).square().mean().backward()
    assert report.fallbacks() == {}
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=2e-3, atol=2e-4, msg=n)


def test_reduce_overhead_compile_of_a_classifier_head():
    """ResNet-50's tail at batch 1 (a split-K GEMM whose tile counters live across calls):
    torch.compile's CUDA-graph trees accept the patched model (no live tensor of ours in
    their pool) and replay the eager result."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    model = model.eval().cuda().half()
    x = torch.randn(1, 2048, 7, 7, device="cuda", dtype=torch.float16).contiguous(
        memory_format=CL)
    with torch.inference_mode(), dt.patched(model) as report:
        want = model(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
        for _ in range(4):
            got = compiled(x).clone()
    assert report.fallbacks() == {}
    assert _rel(got, want) <= 1e-2



def test_plain_linear_with_a_vendor_choice_runs_as_torchs_own_call():
    """A linear with nothing fused whose choice is cuBLAS / cuBLASLt runs as F.linear (the
    same library, torch's host path, bit for bit torch's result); a plan naming one of
    dnnctl's own kernels, or a fused activation, runs on dnnctl."""
    import torch.nn.functional as F

    from dnnctl.ops.base import Choice
    from dnnctl.ops.dispatch import problem_of
    from dnnctl.ops.matmul.op import ranked
    from dnnctl.ops.registry import get_op
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest
    from dnnctl.torch import keys
    from dnnctl.torch.kernels import VENDOR_VIA_TORCH, device_of

    torch.manual_seed(0)
    x = torch.randn(64, 768, device="cuda", dtype=torch.float16)
    w = torch.randn(2304, 768, device="cuda", dtype=torch.float16) * 0.03
    b = torch.randn(2304, device="cuda", dtype=torch.float16)
    ops = torch.ops.dnnctl
    problem = problem_of(get_op("matmul"), keys.linear(x, w, True, "none"))
    _, dev = device_of(x)

    def plan_of(variant: str, params: dict) -> LoadedPlan:
        section = Section(dev.fingerprint(), kernels_digest(), "2026-12-06T00:00:00Z", {},
                          [PlanEntry(problem, Choice.of(variant, params))])
        return LoadedPlan(Plan([section]))

    with torch.inference_mode():
        before = VENDOR_VIA_TORCH["matmul"]
        lt = dt.plan_handle(plan_of("cublaslt", {}))
        got = ops.linear(x, w, b, "none", lt)
        assert VENDOR_VIA_TORCH["matmul"] == before + 1
        assert torch.equal(got, F.linear(x, w, b))
        # one of dnnctl's own kernels, planned: runs on dnnctl
        own = next(e for e in ranked(problem, "cupy", dev)
                   if e.variant not in ("cublas", "cublaslt"))
        mine = ops.linear(x, w, b, "none", dt.plan_handle(plan_of(own.variant,
                                                                   dict(own.params))))
        assert VENDOR_VIA_TORCH["matmul"] == before + 1
        assert _rel(mine, F.linear(x, w, b)) <= 2e-2
        # a fused activation: dnnctl's one call
        fused = ops.linear(x, w, b, "gelu", lt)
        assert VENDOR_VIA_TORCH["matmul"] == before + 1
        assert _rel(fused, F.gelu(F.linear(x, w, b))) <= 2e-2


def test_plain_conv_with_cudnn_chosen_runs_as_torchs_own_call():
    """A convolution with nothing fused (a training-mode conv, BatchNorm not folded) whose
    default or planned choice is cuDNN (torch_cudnn) runs as torch's own F.conv2d; a plan
    entry naming one of dnnctl's own kernels, and a fused activation, still run on dnnctl."""
    import torch.nn.functional as F

    import dnnctl.torch as dt
    from dnnctl.ops.base import Choice
    from dnnctl.ops.conv2d.op import own_choice
    from dnnctl.ops.dispatch import problem_of
    from dnnctl.ops.registry import get_op
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest
    from dnnctl.torch import keys
    from dnnctl.torch.kernels import VENDOR_VIA_TORCH, device_of

    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=cl)
    w = (torch.randn(96, 64, 3, 3, device="cuda", dtype=torch.float16) * 0.05).to(
        memory_format=cl)
    ops = torch.ops.dnnctl
    problem = problem_of(get_op("conv2d"), keys.hashable(keys.conv2d(
        x, w, False, (1, 1), (1, 1), (1, 1), 1, "none", False, True, False)))
    _, dev = device_of(x)
    assert get_op("conv2d").default_choice(problem, "cupy", dev).variant == "torch_cudnn"

    def plan_of(choice: Choice) -> LoadedPlan:
        section = Section(dev.fingerprint(), kernels_digest(), "2026-12-06T00:00:00Z", {},
                          [PlanEntry(problem, choice)])
        return LoadedPlan(Plan([section]))

    want = F.conv2d(x, w, None, 1, 1)
    with torch.inference_mode():
        before = VENDOR_VIA_TORCH["conv2d"]
        got = ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "none", None, 0)
        assert VENDOR_VIA_TORCH["conv2d"] == before + 1
        assert torch.equal(got, want)
        own = own_choice(problem, "cupy", dev)
        mine = ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "none", None,
                          dt.plan_handle(plan_of(own)))
        assert VENDOR_VIA_TORCH["conv2d"] == before + 1
        assert _rel(mine, want) <= 2e-2
        fused = ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "relu", None, 0)
        assert VENDOR_VIA_TORCH["conv2d"] == before + 1
        assert _rel(fused, F.relu(want)) <= 2e-2
