"""``patch(model, graphs=True)`` where no graph can be captured (CPU tensors, grad on): the
patched forward runs as it is; the option's errors; a graphed model's life (pickle, deep
copy, unpatch, retrace); and the watch that tells a replay its model changed, in C++ and in
Python. The captures themselves run in tests/gpu/test_torch_graphs_gpu.py."""

from __future__ import annotations

import copy
import io
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from torch import nn  # noqa: E402

from dnnctl.backends import replay  # noqa: E402
from dnnctl.errors import UsageError  # noqa: E402
from dnnctl.torch import graphs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _torch_models import Counts, SmallResNet, ViTBlock  # noqa: E402


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return SmallResNet().eval()


def test_cpu_calls_run_the_patched_forward_and_are_counted_nowhere():
    plain, graphed = _resnet(), _resnet()
    report = dt.patch(graphed, graphs=True)
    dt.patch(plain)
    assert report.graphs and "CUDA graphs" in report.summary()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for _ in range(4):
            assert torch.equal(graphed(x), plain(x))
    info = dt.graph_info(graphed)
    assert (info.replays, info.captures, info.eager, info.graphs) == (0, 0, 0, 0)
    assert dt.graph_info(plain) is None


@pytest.mark.parametrize("kwargs, what", [({"graphs": "yes"}, "graphs must be True"),
                                          ({"graphs": True, "max_graphs": 0}, "max_graphs"),
                                          ({"graphs": True, "max_graphs": 2.0}, "max_graphs")])
def test_bad_options_are_usage_errors(kwargs, what):
    model = _resnet()
    with pytest.raises(UsageError, match=what):
        dt.patch(model, **kwargs)
    assert not dt.is_patched(model)


def test_pickle_deepcopy_unpatch_and_retrace_keep_the_graphed_forward():
    model = _resnet()
    dt.patch(model, graphs=True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)  # comes back unpatched
        assert not dt.is_patched(loaded) and dt.graph_info(loaded) is None
        assert torch.allclose(loaded(x), want, rtol=1e-4, atol=1e-4)
        twin = copy.deepcopy(model)  # a graphed model of its own
        assert isinstance(twin.__dict__["forward"], graphs.GraphedForward)
        assert twin.__dict__["forward"].model is twin
        assert torch.equal(twin(x), want)
        # a module replaced: the traced forward underneath is traced again, the graphed
        # forward stays on top of it
        inner = model.__dict__["forward"].inner
        model.fc = nn.Linear(model.fc.in_features, 3)
        assert model(x).shape == (1, 3)
        assert isinstance(model.__dict__["forward"], graphs.GraphedForward)
        assert model.__dict__["forward"].inner is not inner
    dt.unpatch(model)
    assert "forward" not in model.__dict__ and dt.graph_info(model) is None


def _changes():
    """(what, a change to the model) that a graph captured before it must see."""

    def replace_param(m):
        m.fc.weight = nn.Parameter(m.fc.weight.detach().clone())

    def swap_data(m):
        m.fc.weight.data = m.fc.weight.detach().clone()

    def in_place(m):
        with torch.no_grad():
            m.fc.bias.add_(1)

    def attribute(m):
        m.fc.in_features = m.fc.in_features + 0 + 1

    def new_module(m):
        m.extra = nn.ReLU()

    def new_buffer(m):
        m.register_buffer("scale", torch.ones(1))

    def train_flag(m):
        m.fc.train()

    return [("parameter replaced", replace_param, True),
            (".data swapped", swap_data, True),
            ("written in place", in_place, False),
            ("attribute reassigned", attribute, True),
            ("module added", new_module, True),
            ("buffer added", new_buffer, True),
            ("a submodule's training flag", train_flag, True)]


def _states(model, fn):
    g = graphs.GraphedForward(model, model.forward)
    pairs = graphs._watch(g)
    held = [d.get(k) for d, k in pairs if k is not ...]
    before = (fn(pairs, False), fn(pairs, True))
    return g, pairs, held, before


@pytest.mark.parametrize("what, change, without_versions", _changes(),
                         ids=[c[0] for c in _changes()])
@pytest.mark.parametrize("impl", ["python", "c++"])
def test_the_watch_sees_each_change(what, change, without_versions, impl, monkeypatch):
    if impl == "c++":
        monkeypatch.setenv("DNNCTL_REPLAY", "1")
        if replay.module(wait=None) is None:
            pytest.skip(f"the replay extension is not built here: {replay.failure()}")
    else:
        monkeypatch.setattr(replay, "STATE", None)
    model = _resnet()
    g, pairs, held, (plain, versioned) = _states(model, graphs._state)
    assert graphs._state(pairs, True) == versioned  # nothing changed: the same state
    change(model)
    pairs_now = graphs._watch(g)  # a graph keeps its own pairs; new ones see more
    assert graphs._state(pairs, True) != versioned or graphs._state(pairs_now, True) != \
        graphs._state(pairs, True), what
    # the check of a forward's own changes ignores writes in place (a KV cache), and only
    # those
    assert (graphs._state(pairs, False) != plain) == without_versions, what
    del held


def test_packed_state_agrees_with_python(monkeypatch):
    monkeypatch.setenv("DNNCTL_REPLAY", "1")
    if replay.module(wait=None) is None:
        pytest.skip(f"the replay extension is not built here: {replay.failure()}")
    model = ViTBlock(32, 4).eval()
    with torch.inference_mode():  # an inference tensor: no version counter
        model.register_buffer("frozen", torch.ones(3))
    g = graphs.GraphedForward(model, model.forward)
    pairs = graphs._watch(g)
    packed = replay.STATE(pairs, True)
    assert len(packed) == 24 * len(pairs)
    monkeypatch.setattr(replay, "STATE", None)
    py = graphs._state(pairs, True)
    rows = [tuple(int.from_bytes(packed[i:i + 8], "little", signed=True)
                  for i in range(r * 24, r * 24 + 24, 8)) for r in range(len(pairs))]
    for row, p in zip(rows, py):
        assert row == (p if isinstance(p, tuple) else (p, 0, 0))
    with pytest.raises(TypeError, match="pairs"):
        replay.module().state(((1, 2),), True)


def test_a_forward_that_changes_its_attributes_is_not_traced():
    """fx runs the forward's Python once, on proxies: a counter it bumps would be baked into
    the traced graph (and bumped by the trace itself). patch restores it and runs the model
    module by module, as it would run unpatched."""

    torch.manual_seed(0)
    model, plain = Counts().eval(), Counts().eval()
    plain.load_state_dict(model.state_dict())
    report = dt.patch(model, graphs=True)
    assert not report.traced and "changes attribute 'calls'" in report.trace_error
    assert model.calls == 0 and "last" not in model.__dict__
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            assert torch.allclose(model(x), plain(x), rtol=1e-5, atol=1e-6)
    assert model.calls == 3 and model.last == 2
