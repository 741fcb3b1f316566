"""``dnnctl.torch.patch(model, plan, graphs=True)`` on a CUDA device: inference calls replayed
from CUDA graphs give bitwise the patched eager model's results, follow changes to the model
(weights loaded, a module replaced), never overwrite what an earlier call returned, and stay
eager where a replay would not do what the forward does.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_torch_graphs_gpu.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
dt = pytest.importorskip("dnnctl.torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _torch_models import Counts, LlamaBlock, SmallResNet, ViTBlock  # noqa: E402
from _torch_models import bn_stats as _bn_stats  # noqa: E402
from torch import nn  # noqa: E402

from dnnctl.backends import replay  # noqa: E402
from dnnctl.torch import graphs as graphs_module  # noqa: E402

pytestmark = pytest.mark.gpu
CL = torch.channels_last
# the replay extension loads in the background; the counts below assume it is there from the
# first call (its packed signatures are other keys than the Python ones made before it)
replay.module(wait=300)



def _cases():
    torch.manual_seed(0)
    resnet = _bn_stats(SmallResNet()).eval().to("cuda", torch.float16).to(memory_format=CL)
    x_r = lambda: torch.randn(4, 3, 32, 32, device="cuda",  # noqa: E731
                              dtype=torch.float16).contiguous(memory_format=CL)
    vit = ViTBlock(64, 4).eval().to("cuda", torch.float16)
    x_v = lambda: torch.randn(2, 17, 64, device="cuda", dtype=torch.float16)  # noqa: E731
    llama = LlamaBlock(64, 4, 176).eval().to("cuda", torch.bfloat16)
    x_l = lambda: torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return [("resnet fp16 channels_last", resnet, x_r), ("vit fp16", vit, x_v),
            ("llama bf16", llama, x_l)]


CASES = _cases()


def _pair(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(patched eager, patched with graphs) of two copies of ``model``."""
    eager, graphed = copy.deepcopy(model), copy.deepcopy(model)
    dt.patch(eager)
    dt.patch(graphed, graphs=True)
    return eager, graphed


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_replays_are_bitwise_the_patched_eager_model(case, mode):
    _, model, make = case
    eager, graphed = _pair(model)
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    outs = []
    with ctx():
        for _ in range(6):  # two eager calls, the capture, replays on fresh inputs
            x = make()
            want = eager(x)
            got = graphed(x)
            assert torch.equal(got, want)
            outs.append((got, want))
    info = dt.graph_info(graphed)
    assert info.captures == 1 and info.replays == 4 and info.eager == 2, info
    # a returned output is a copy: later replays did not overwrite earlier results
    for got, want in outs:
        assert torch.equal(got, want)
    assert len({o.data_ptr() for o, _ in outs}) == len(outs)


def test_new_signature_is_captured_on_its_own_and_old_ones_kept():
    _, model, make = CASES[0]
    eager, graphed = _pair(model)
    with torch.no_grad():
        for n in (4, 2, 4, 2, 4, 2, 4, 2):
            x = torch.randn(n, 3, 32, 32, device="cuda", dtype=torch.float16).contiguous(
                memory_format=CL)
            assert torch.equal(graphed(x), eager(x))
    info = dt.graph_info(graphed)
    assert info.captures == 2 and info.graphs == 2 and info.replays == 4, info


def test_loaded_weights_and_a_replaced_module_are_followed():
    _, model, make = CASES[0]
    eager, graphed = _pair(model)
    other = _bn_stats(SmallResNet(), seed=7).eval().to("cuda", torch.float16)
    with torch.no_grad():
        for _ in range(3):
            x = make()
            assert torch.equal(graphed(x), eager(x))
        # weights loaded in place (BatchNorm's statistics too: the fold must be redone)
        graphed.load_state_dict(other.state_dict())
        eager.load_state_dict(other.state_dict())
        for _ in range(4):
            x = make()
            assert torch.equal(graphed(x), eager(x))
        assert dt.graph_info(graphed).stale == 1
        # a module replaced by another
        for m in (graphed, eager):
            m.fc = nn.Linear(m.fc.in_features, 5).to("cuda", torch.float16)
            m.fc.load_state_dict(graphed.fc.state_dict())
        for _ in range(4):
            x = make()
            got = graphed(x)
            assert got.shape[-1] == 5
            assert torch.equal(got, eager(x))


def test_kv_cache_written_in_place_by_each_replay():
    """A decode step that writes its new key / value into a cache buffer: each replay writes
    it, as each eager call does."""

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)
            self.register_buffer("cache", torch.zeros(4, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.cache[1:] = self.cache[:-1].clone()
            self.cache[0] = self.proj(x)[0]
            return self.cache.sum(0, keepdim=True) + x

    eager, graphed = _pair(Step().cuda().eval())
    with torch.no_grad():
        for _ in range(8):
            x = torch.randn(1, 32, device="cuda")
            assert torch.equal(graphed(x), eager(x))
            assert torch.equal(graphed.cache, eager.cache)
    assert dt.graph_info(graphed).replays == 6


def test_forwards_a_replay_would_not_reproduce_stay_eager():
    class Syncs(nn.Module):  # reads a GPU value on the host: the capture fails
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return y * 2 if float(y.sum()) > 0 else y

    class Writes(nn.Module):  # writes into its input
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(0.5)
            return self.lin(x)

    for cls, why in ((Counts, "replaces"), (Syncs, "capture failed"),
                     (Writes, "writes into an input")):
        eager, graphed = _pair(cls().cuda().eval())
        with torch.no_grad():
            for _ in range(5):
                x = torch.randn(2, 8, device="cuda")
                x2 = x.clone()
                assert torch.equal(graphed(x), eager(x2)), cls.__name__
                assert torch.equal(x, x2)
        info = dt.graph_info(graphed)
        assert info.replays == 0 and info.captures == 0, (cls.__name__, info)
        assert any(why in r for r in info.refused), (cls.__name__, info.refused)
        # the CUDA context is still sound after the failed capture
        assert torch.equal(torch.ones(3, device="cuda") * 2, torch.full((3,), 2.0,
                                                                         device="cuda"))


def test_a_forward_hook_keeps_the_model_eager_until_removed():
    _, model, make = CASES[1]
    eager, graphed = _pair(model)
    seen = []
    with torch.no_grad():
        for _ in range(3):
            x = make()
            assert torch.equal(graphed(x), eager(x))
        handle = graphed.ln2.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        for _ in range(4):  # the hook runs on every call (a hooked module is never fused)
            x = make()
            assert torch.allclose(graphed(x), eager(x), rtol=2e-2, atol=2e-2)
        assert len(seen) == 4
        info = dt.graph_info(graphed)
        assert info.stale == 1 and any("hook" in r for r in info.refused), info
        handle.remove()
        for _ in range(4):
            x = make()
            assert torch.allclose(graphed(x), eager(x), rtol=2e-2, atol=2e-2)
        assert len(seen) == 4
        assert dt.graph_info(graphed).captures == 2


def test_grad_on_training_mode_and_side_streams():
    _, model, make = CASES[2]
    eager, graphed = _pair(model)
    x = make()
    for _ in range(3):  # grad on: never captured
        assert torch.equal(graphed(x), eager(x))
    assert dt.graph_info(graphed).captures == 0
    side = torch.cuda.Stream()
    with torch.no_grad():
        for i in range(6):  # the replays alternate between the default and a side stream
            x = make()
            want = eager(x)
            if i % 2:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    got = graphed(x)
                torch.cuda.current_stream().wait_stream(side)
            else:
                got = graphed(x)
            assert torch.equal(got, want)
    assert dt.graph_info(graphed).replays == 4


def test_unpatch_deepcopy_and_compile_of_a_graphed_model():
    _, model, make = CASES[1]
    eager, graphed = _pair(model)
    with torch.no_grad():
        x = make()
        for _ in range(3):
            assert torch.equal(graphed(x), eager(x))
        twin = copy.deepcopy(graphed)  # a patched model of its own, with no graph yet
        for _ in range(3):
            assert torch.equal(twin(x), eager(x))
        assert dt.graph_info(twin).captures == 1
        compiled = torch.compile(graphed)  # dynamo traces the patched forward underneath
        assert torch.allclose(compiled(x).float(), eager(x).float(), rtol=2e-2, atol=2e-2)
    dt.unpatch(graphed)
    assert dt.graph_info(graphed) is None
    assert "forward" not in graphed.__dict__


def test_shapes_that_change_every_call_stop_new_captures():
    eager, graphed = _pair(nn.Sequential(nn.Linear(16, 16), nn.GELU()).cuda().eval())
    dt.unpatch(graphed)
    dt.patch(graphed, graphs=True, max_graphs=2)
    with torch.no_grad():
        for n in range(1, 11):
            for _ in range(3):
                x = torch.randn(n, 16, device="cuda")
                assert torch.equal(graphed(x), eager(x))
    info = dt.graph_info(graphed)
    limit = graphs_module.CAPTURE_LIMIT * 2
    assert info.captures == limit and info.graphs == 2, info
    assert any("signatures captured already" in r for r in info.refused), info.refused
