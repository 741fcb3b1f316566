"""dnnctl.torch.record: the workload is exactly the problems the patched model sends to the
dispatcher, it round-trips through the workload file format, and ``dnnctl tune`` plans it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import LlamaBlock, SmallResNet, ViTBlock  # noqa: E402
from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from dnnctl.cli.app import app  # noqa: E402
from dnnctl.ops.base import Field  # noqa: E402
from dnnctl.plan import read_plan  # noqa: E402
from dnnctl.torch import kernels  # noqa: E402
from dnnctl.workloads import read_workload  # noqa: E402


class _Spy:
    """A plan that answers 'not planned' and remembers every problem it was asked about."""

    def __init__(self):
        self.seen = set()

    def lookup(self, problem, backend, device):
        self.seen.add(problem)
        return None


@pytest.mark.parametrize("make,shape", [(SmallResNet, (2, 3, 12, 12)),
                                        (ViTBlock, (2, 5, 32)), (LlamaBlock, (1, 4, 32))],
                         ids=["resnet", "vit", "llama"])
def test_recorded_problems_are_the_dispatchers(make, shape):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    spy = _Spy()
    wl = dt.record(model, (x,), plan=spy)
    assert set(wl.problems) == spy.seen
    assert not dt.patch_module.is_patched(model)


def test_counts_modes_and_state_are_restored():
    torch.manual_seed(0)
    model = SmallResNet().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wl = dt.record(model, torch.randn(2, 3, 12, 12))  # inference problems of a train model
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    by_op = {}
    for it in wl.items:
        by_op[it.problem.op] = by_op.get(it.problem.op, 0) + it.count
    # stem conv, 3 convs, 3 convs + a downsample conv, all with BN folded; the fc layer; the
    # ReLU after each block's residual add is in its last conv (residual_before_act)
    assert by_op == {"conv2d": 8, "pool2d": 1, "global_avg_pool2d": 1, "matmul": 1}
    assert all(it.problem["bias"] for it in wl.items if it.problem.op == "conv2d")
    assert sum(it.count for it in wl.items if it.problem.op == "conv2d"
               and it.problem["residual_before_act"]) == 2


def test_train_records_backward_only_for_ops_with_a_pass_field():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).train()
    wl = dt.record(model, torch.randn(3, 8), train=True)
    has_pass = {op for op in wl.ops() if "pass" in kernels.get_op(op).fields}
    assert all(it.problem.get("pass", "forward") == "forward" or it.problem.op in has_pass
               for it in wl.items)
    assert all(p.grad is None for p in model.parameters())  # gradients restored


def test_backward_passes_follow_the_ops_pass_field():
    conv_like = {"pass": Field("str", "forward", choices=("forward", "dgrad", "wgrad"))}
    norm_like = {"pass": Field("str", "forward", choices=("forward", "backward"))}
    assert kernels.backward_passes(conv_like, ["dgrad", "wgrad"]) == ["dgrad", "wgrad"]
    assert kernels.backward_passes(conv_like, ["wgrad"]) == ["wgrad"]  # first layer: no dgrad
    assert kernels.backward_passes(norm_like, ["dgrad", "wgrad"]) == ["backward"]
    assert kernels.backward_passes(norm_like, ["backward"]) == ["backward"]
    assert kernels.backward_passes({}, ["backward"]) == []


def test_record_save_load_and_tune_through_the_cli(tmp_path, monkeypatch):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8),
                          nn.Softmax(-1)).eval()
    wl = dt.record(model, torch.randn(4, 16))
    path = tmp_path / "model.workload.yaml"
    wl.save(path)
    loaded = read_workload(path)
    assert loaded.items == wl.items and loaded.name == "Sequential"
    res = CliRunner().invoke(app, ["tune", str(path), "--device", "cpu", "-o",
                                   str(tmp_path / "plan.yaml")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"{len(wl.items)}/{len(wl.items)} problems planned" in res.output
    plan = read_plan(tmp_path / "plan.yaml")
    assert {e.problem for e in plan.sections[0].entries} == set(wl.problems)
    # the tuned plan is then used by the patched model: every call an exact hit
    import dnnctl

    loaded_plan = dnnctl.load_plan(str(tmp_path / "plan.yaml"))
    with torch.no_grad(), dt.patched(model, loaded_plan):
        model(torch.randn(4, 16))
    stats = loaded_plan.stats()
    assert set(stats.hits) == set(wl.problems) and not stats.misses, stats


class _KwModel(nn.Module):
    """A Hugging Face style forward (keyword inputs) with grouped-query SDPA inside."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.kv = nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, hidden_states, scale=None):
        b, s, _ = hidden_states.shape
        q = self.q(hidden_states).view(b, s, 4, 8).transpose(1, 2)
        k, v = self.kv(hidden_states).view(b, s, 2, 1, 8).unbind(2)
        return nn.functional.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True,
            scale=scale)


def test_attention_problems_and_keyword_inputs_are_recorded():
    """The attention a model sends to dnnctl is in its workload (fp16: dnnctl's attention
    dtypes), with exactly the key the dispatcher looked up; a dict of inputs is passed as
    keyword arguments."""
    torch.manual_seed(0)
    model = _KwModel().eval().half()
    spy = _Spy()
    wl = dt.record(model, {"hidden_states": torch.randn(2, 7, 32).half()}, plan=spy)
    assert set(wl.problems) == spy.seen
    att = [p for p in wl.problems if p.op == "attention"]
    assert len(att) == 1
    assert (att[0]["heads_q"], att[0]["heads_kv"], att[0]["seq_q"], att[0]["causal"]) == (
        4, 1, 7, "top_left")


@pytest.mark.parametrize("backward", ["plan", "dnnctl"])
def test_training_records_attention_once_per_call(backward):
    """record(train=True): each SDPA call adds its forward and its backward problem once,
    whichever path (torch's fused SDPA or dnnctl's op) runs it."""
    torch.manual_seed(0)
    model = _KwModel().half()
    x = {"hidden_states": torch.randn(2, 7, 32).half().requires_grad_()}
    with dt.patched(model, backward=backward):
        wl = dt.record(model, x, train=True)
    counts = {dict(it.problem.key)["pass"]: it.count for it in wl.items
              if it.problem.op == "attention"}
    assert counts == {"forward": 1, "backward": 1}
