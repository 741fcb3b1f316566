"""Training calls of the memory-bound ops whose backward runs torch's formula go to torch's own
op whole (dnnctl.torch.library.torch_trains): one C++ autograd node, no Python Function and no
statistics recomputed in the backward. Through the stub GPU of benchmarks/stub_gpu.py (torch
CPU tensors take the CUDA route; torch's own ops compute for real)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import dnnctl.torch as dt  # noqa: E402
from dnnctl.torch import grad_plan, kernels  # noqa: E402
from dnnctl.torch.library import TORCH_TRAINS, run_op  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "benchmarks" / "stub_gpu.py").is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))

import stub_gpu  # noqa: E402


class _Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm, self.act, self.sm = nn.LayerNorm(d), nn.GELU("tanh"), nn.Softmax(-1)

    def forward(self, x):  # (no product: the stub's launches compute nothing)
        return self.sm(self.act(self.norm(x) * 2.0))


def _step(model, x):
    y = model(x)
    y.square().sum().backward()
    return y


def test_a_patched_training_block_hands_norm_activation_and_softmax_to_torch():
    torch.manual_seed(0)
    eager = _Block().train()
    patched = _Block().train()
    patched.load_state_dict(eager.state_dict())
    x = torch.randn(4, 7, 32)
    with stub_gpu.installed():
        dt.patch(patched)
        grad_plan.BACKWARD_PATHS.clear()
        xe, xp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ye, yp = _step(eager, xe), _step(patched, xp)
        names = []
        node = yp.grad_fn
        while node is not None:  # the chain softmax <- gelu <- mul <- layer_norm
            names.append(type(node).__name__)
            nxt = [f for f, _ in node.next_functions if f is not None
                   and "AccumulateGrad" not in type(f).__name__]
            node = nxt[0] if nxt else None
        paths = grad_plan.paths_summary()
    assert not any("Dnnctl" in n for n in names), names
    assert any("NativeLayerNorm" in n for n in names) and any("Gelu" in n for n in names)
    assert torch.equal(ye, yp)
    assert torch.equal(xe.grad, xp.grad)
    for a, b in zip(eager.parameters(), patched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    for op in ("layer_norm", "gelu", "softmax"):
        assert paths[f"{op}/backward"]["torch"] == 1, paths


def test_a_planned_own_backward_keeps_the_dnnctl_op():
    """Mode "dnnctl" (dnnctl's own backward kernels where the default picks one) keeps the
    op's autograd Function; mode "torch" hands it over."""
    x = torch.randn(4, 32, requires_grad=True)
    w, b = torch.ones(32, requires_grad=True), torch.zeros(32, requires_grad=True)
    own = kernels.plan_handle(None, "dnnctl")
    theirs = kernels.plan_handle(None, "torch")
    with stub_gpu.installed():
        y_own = run_op("layer_norm", x, w, b, 1e-5, own)
        y_torch = run_op("layer_norm", x, w, b, 1e-5, theirs)
        with torch.no_grad():  # no autograd: dnnctl's kernel (launched by the stub)
            y_plain = run_op("layer_norm", x, w, b, 1e-5, theirs)
    assert "Dnnctl" in type(y_own.grad_fn).__name__
    assert "NativeLayerNorm" in type(y_torch.grad_fn).__name__
    assert y_plain.grad_fn is None


@pytest.mark.parametrize("name,args", [
    ("layer_norm", (None, None, 1e-5)), ("rms_norm", (None, 1e-6)), ("softmax", (0,)),
    ("log_softmax", (-1,)), ("gelu", ("tanh",)), ("leaky_relu", (0.2,)), ("silu", ()),
    ("hardswish", ()),
])
def test_torchs_forms_of_the_handed_over_ops_match_the_references(name, args):
    """Each op's torch form computes the op's meaning (the same as on the CPU path)."""
    x = torch.randn(5, 16, dtype=torch.float64)
    got = TORCH_TRAINS[name][1](x, *args)
    want = run_op(name, x, *args, 0)  # CPU: the numpy backend's kernels
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10)
