"""Backwards that must themselves be differentiable (``create_graph=True``: gradient
penalties, Hessian-vector products, MAML) through the ``torch.ops.dnnctl`` ops and a
patched model: second derivatives equal eager's, or torch's own error where eager has
none, never silently missing terms."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from torch import nn  # noqa: E402
from torch.autograd import gradgradcheck  # noqa: E402

OPS = torch.ops.dnnctl
F64 = torch.float64


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, requires_grad=True)


def _stats() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)


# each: (the op's call, its differentiable inputs); float64 runs torch's formulas
CASES = {
    "silu": lambda: (OPS.silu, (_r(3, 5) * 3,)),
    "linear_silu": lambda: (OPS.linear, (_r(3, 4), _r(5, 4), _r(5), "silu")),
    "conv2d_silu_residual": lambda: (OPS.conv2d, (_r(2, 3, 5, 5), _r(4, 3, 3, 3), _r(4),
                                                  [1, 1], [1, 1], [1, 1], 1, "silu",
                                                  _r(2, 4, 5, 5))),
    "group_norm": lambda: (OPS.group_norm, (_r(2, 4, 3, 3), 2, _r(4), _r(4), 1e-5)),
    "batch_norm_train": lambda: (lambda *a: OPS.batch_norm_train(*a)[0],
                                 (_r(2, 3, 4, 4), *_stats(), _r(3), _r(3), 0.1, 1e-5)),
    "batch_norm_train_relu": lambda: (lambda *a: OPS.batch_norm_train(*a)[0],
                                      (_r(2, 3, 4, 4), *_stats(), _r(3), _r(3), 0.1, 1e-5,
                                       0, "relu", _r(2, 3, 4, 4))),
    "attention": lambda: (lambda *a: OPS.attention(*a)[0],
                          (_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8), True)),
    "attention_gqa": lambda: (lambda *a: OPS.attention(*a)[0],
                              (_r(1, 4, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8), False, None,
                               True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_second_derivatives_of_the_ops_are_exact(case):
    """gradgradcheck in float64. Before: silu's and group_norm's torch path ran kernels
    with no derivative (an error where eager works), batch_norm_train's saved statistics
    asked for one (NotImplementedError), and attention's gradients had no graph at all:
    its second derivatives were silently zero."""
    torch.manual_seed(0)
    op, args = CASES[case]()
    assert gradgradcheck(op, args, atol=1e-5)


class _ConvModule(nn.Module):
    """Conformer's convolution module, 2-D: pointwise conv -> GroupNorm -> SiLU ->
    depthwise conv -> SiLU -> pointwise conv, with a residual."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(c, c, 1)
        self.norm = nn.GroupNorm(2, c)
        self.act = nn.SiLU()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw2 = nn.Conv2d(c, c, 1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * 16, 16), nn.SiLU(),
                                  nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pw2(self.act(self.dw(self.act(self.norm(self.pw1(x))))))
        return self.head(x + y)


@pytest.mark.parametrize("backward", ["plan", "dnnctl"])
def test_a_gradient_penalty_through_silu_and_group_norm_equals_eager(backward):
    """A WGAN-GP style penalty (the input gradient's norm, trained) on a model with SiLU
    (fused into the linear) and GroupNorm: "derivative for aten::silu_backward is not
    implemented" before, where eager trains."""
    torch.manual_seed(0)
    ref = _ConvModule().train()
    model = copy.deepcopy(ref)
    dt.patch(model, backward=backward)
    x = torch.randn(3, 8, 4, 4)

    def penalty(m: nn.Module) -> list[torch.Tensor]:
        xi = x.clone().requires_grad_(True)
        g, = torch.autograd.grad(m(xi).sum(), xi, create_graph=True)
        ((g.flatten(1).norm(dim=1) - 1) ** 2).mean().backward()
        return [p.grad for p in m.parameters()]

    for got, want in zip(penalty(model), penalty(ref)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
