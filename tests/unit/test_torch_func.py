"""torch.func over a patched model: gradients by torch.func.grad (MAML's inner step, over
the parameters through functional_call), per-sample gradients (vmap of grad) and
jacrev, against the unpatched model."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import LlamaBlock, SmallResNet, ViTBlock  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, jacrev, vmap  # noqa: E402

from dnnctl.errors import UsageError  # noqa: E402

MODELS = {
    "resnet": (SmallResNet, (2, 3, 16, 16)),
    "vit": (ViTBlock, (2, 5, 32)),
    "llama": (LlamaBlock, (2, 6, 32)),
}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", list(MODELS))
def test_func_grad_over_the_parameters_equals_eager(name, mode):
    """torch.func.grad of a loss through functional_call (MAML, meta-learning): the
    patched model raised "In order to use an autograd.Function with functorch transforms
    ... it must override the setup_context staticmethod"."""
    make, shape = MODELS[name]
    torch.manual_seed(0)
    ref = make().train(mode == "train")
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(shape)
    params = {k: v.detach() for k, v in ref.named_parameters()}
    buffers = {k: v.clone() for k, v in ref.named_buffers()}

    def loss(p: dict, m: nn.Module) -> torch.Tensor:
        state = {**p, **{k: v.clone() for k, v in buffers.items()}}
        return functional_call(m, state, (x,)).square().mean()

    want, got = grad(loss)(params, ref), grad(loss)(params, model)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6, msg=k)


def test_per_sample_gradients_and_jacrev_equal_eager():
    """vmap of grad (per-sample gradients, DP-SGD) and jacrev through Linear, LayerNorm
    and GELU on dnnctl."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 1))
    model = copy.deepcopy(ref)
    dt.patch(model)
    params = {k: v.detach() for k, v in ref.named_parameters()}
    xs = torch.randn(5, 8)

    def loss(p: dict, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return functional_call(m, p, (x[None],)).sum()

    per_sample = vmap(grad(loss), in_dims=(None, None, 0))
    want, got = per_sample(params, ref, xs), per_sample(params, model, xs)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6, msg=k)
    torch.testing.assert_close(jacrev(model)(xs), jacrev(ref)(xs), rtol=1e-4, atol=1e-6)


def test_an_op_called_directly_under_func_grad_says_how():
    """torch.ops.dnnctl.* called directly under torch.func.grad: a dnnctl error naming the
    way that works, not "could not find kernel for HigherOrderOperator"."""
    from dnnctl.torch.library import run_op

    w = torch.randn(3, 4)
    x = torch.randn(2, 4)
    with pytest.raises(UsageError, match="torch.func transform"):
        grad(lambda w: torch.ops.dnnctl.linear(x, w, None, "none", 0).sum())(w)
    got = grad(lambda w: run_op("linear", x, w, None, "none", 0).sum())(w)
    torch.testing.assert_close(got, grad(lambda w: (x @ w.t()).sum())(w))
