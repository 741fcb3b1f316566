"""Linear layers written as functions of a module's own parameters (transformers' Conv1D,
CLIP's ``x @ self.proj``, ``F.linear(x, self.weight, self.bias)``): patch runs them as
``dnnctl::linear`` in a traced inference model, gives eager's outputs, and leaves the rest."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dnnctl.torch as dt  # noqa: E402
from dnnctl.torch import kernels  # noqa: E402
from dnnctl.torch.param_linear import ParamLinear  # noqa: E402


class Projections(nn.Module):
    """Each call form once, and the forms that are not linears of a parameter."""

    def __init__(self, d: int = 16, out: int = 12) -> None:
        super().__init__()
        self.w_in_out = nn.Parameter(torch.randn(d, out) * 0.2)  # (in, out), as Conv1D's
        self.b = nn.Parameter(torch.randn(out) * 0.1)
        self.proj = nn.Parameter(torch.randn(out, d) * 0.2)  # CLIP's text_projection
        self.weight = nn.Parameter(torch.randn(d, d) * 0.2)  # (out, in), as nn.Linear's
        self.bias = nn.Parameter(torch.randn(d) * 0.1)
        self.register_buffer("basis", torch.randn(d, d) * 0.2)
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.b, x.view(-1, x.size(-1)), self.w_in_out)  # -> (rows, out)
        h = h.view(x.size(0), x.size(1), -1) @ self.proj  # -> d
        h = F.linear(h, self.weight, self.bias) + torch.matmul(h, self.basis)
        h = F.linear(h, self.weight)  # no bias
        g = torch.matmul(self.weight, h.transpose(-1, -2))  # parameter on the left: not taken
        side = torch.addmm(self.bias, h.reshape(-1, h.shape[-1]), self.weight, beta=0.5)
        return self.lin(h) + g.transpose(-1, -2) + side.view_as(h)


def test_linears_of_parameters_run_on_dnnctl_and_equal_eager() -> None:
    torch.manual_seed(0)
    ref = Projections().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16)
    want = ref(x)
    report = dt.patch(model)
    assert report.traced
    routed = {c.note for c in report.covered if c.module != "Linear"}
    assert routed == {"addmm of the parameter w_in_out", "matmul of the parameter proj",
                      "linear of the parameter weight", "matmul of the parameter basis"}, routed
    # F.linear twice; addmm with beta=0.5 and the parameter on the left are not taken
    assert len([c for c in report.covered if c.module != "Linear"]) == 5
    before = dict(kernels.FALLBACKS)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert before == kernels.FALLBACKS  # every routed call ran on dnnctl
    # the weights are read live: a change after patch is seen
    with torch.no_grad():
        model.w_in_out.mul_(2)
        ref.w_in_out.mul_(2)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    dt.unpatch(model)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_operands_that_do_not_fit_run_the_torch_function() -> None:
    w = torch.randn(6, 4)
    b = torch.randn(4)
    mm = ParamLinear(torch.matmul, True, 0)
    v = torch.randn(6)
    torch.testing.assert_close(mm(v, w), v @ w)  # a 1-D x: torch's matmul
    am = ParamLinear(torch.addmm, True, 0)
    with pytest.raises(RuntimeError):
        am(torch.randn(3, 5), w, b)  # torch's own shape error, not another one
    x = torch.randn(3, 6)
    torch.testing.assert_close(am(x, w, b), torch.addmm(b, x, w), rtol=1e-5, atol=1e-5)


def test_training_mode_leaves_them_to_torch() -> None:
    model = Projections().train()
    report = dt.patch(model)
    assert report.traced and {c.module for c in report.covered} == {"Linear"}
    dt.unpatch(model)
