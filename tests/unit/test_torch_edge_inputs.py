"""Patched models on inputs real code gives them: an empty batch (a detection head with no
boxes, a filtered batch), a single unbatched row for a norm over several trailing dims.
Each compared with the unpatched model: outputs, input and parameter gradients, BatchNorm
statistics (CPU, numpy backend)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import SmallResNet  # noqa: E402
from torch import nn  # noqa: E402


def _compare(ref: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    """Forward and backward (one random output gradient) through both; everything equal."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = ref(xa), model(xb)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad)
    for (n, pa), pb in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, msg=n)
    for (n, ba), bb in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(bb, ba, msg=n)


@pytest.mark.parametrize("backward", ["plan", "dnnctl"])
@pytest.mark.parametrize("case", ["bn2d", "bn1d", "resnet", "group_norm_3d", "group_norm_2d"])
def test_an_empty_batch_trains_as_eager(case, backward):
    """N = 0 in training: torch returns an empty result, leaves the running statistics as
    they were and counts the batch; the patched BatchNorm raised "Expected more than 1
    value per channel" and GroupNorm over (0, C, L) could not reshape its input."""
    torch.manual_seed(0)
    ref, shape = {
        "bn2d": (nn.BatchNorm2d(4), (0, 4, 3, 3)),
        "bn1d": (nn.BatchNorm1d(4), (0, 4)),
        "resnet": (SmallResNet(), (0, 3, 16, 16)),
        "group_norm_3d": (nn.GroupNorm(2, 4), (0, 4, 5)),
        "group_norm_2d": (nn.GroupNorm(2, 4), (0, 4)),
    }[case]
    ref.train()
    model = copy.deepcopy(ref)
    dt.patch(model, backward=backward)
    _compare(ref, model, torch.randn(shape))
    if case.startswith("bn"):
        assert int(model.num_batches_tracked) == 1


@pytest.mark.parametrize("backward", ["plan", "dnnctl"])
@pytest.mark.parametrize("norm, shape", [
    (lambda: nn.RMSNorm(8), (8,)),
    (lambda: nn.RMSNorm([2, 8]), (2, 8)),
    (lambda: nn.LayerNorm(8), (8,)),
    (lambda: nn.LayerNorm([2, 8]), (2, 8)),
])
def test_a_norm_over_one_row_gives_the_weights_gradient_its_shape(norm, shape, backward):
    """An RMSNorm whose input is one row (an unbatched vector, or normalized_shape covering
    the whole input): torch's backward path summed the weight gradient with sum(()), which
    reduces every dim, and autograd refused the scalar it returned."""
    torch.manual_seed(0)
    ref = norm()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    model = copy.deepcopy(ref)
    dt.patch(model, backward=backward)
    _compare(ref, model, torch.randn(shape))
