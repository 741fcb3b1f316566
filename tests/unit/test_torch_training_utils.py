"""torch's training utilities around a patched model: stochastic weight averaging
(AveragedModel, update_bn's BatchNorm recalibration), against the unpatched model."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import SmallResNet  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.optim.swa_utils import AveragedModel, update_bn  # noqa: E402


def test_swa_with_bn_recalibration_equals_eager():
    """SWA: train, average the weights (AveragedModel, a deep copy updated in place),
    recalibrate BatchNorm with update_bn (momentum=None: a cumulative average) and
    evaluate. A patched BatchNorm in training with momentum None failed ("Overloaded torch
    operator invoked from Python failed to match any schema"), and one that had it at
    patch time was left to torch; now both run torch's cumulative factor on dnnctl."""
    torch.manual_seed(0)
    ref = SmallResNet().train()
    model = copy.deepcopy(ref)
    dt.patch(model)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g))
               for _ in range(4)]
    outs = []
    for m in (ref, model):
        swa = AveragedModel(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        for x, y in batches:
            F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            swa.update_parameters(m)
        update_bn([x for x, _ in batches], swa)
        swa.eval()
        with torch.no_grad():
            outs.append((swa(batches[0][0]), dict(swa.module.named_buffers())))
    (want, want_bufs), (got, got_bufs) = outs
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for n, b in want_bufs.items():
        torch.testing.assert_close(got_bufs[n], b, rtol=1e-4, atol=1e-5, msg=n)


def test_batch_norm_with_a_cumulative_average_is_covered():
    """momentum=None at patch time: covered (it was left to torch), statistics as torch's."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.ReLU()).train()
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert "1" in {c.name for c in report.covered}
    for i in range(3):
        x = torch.randn(2, 3, 6, 6) + i
        torch.testing.assert_close(model(x), ref(x))
    for (n, b), c in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(c, b, msg=n)
