"""What happens to a model after ``patch``: parametrizations (weight_norm, spectral_norm)
applied before or after it, weights swapped through ``.data``, a float64 model, weights
changed between calls of a compiled model. Each compared with the unpatched model (CPU,
numpy backend)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import SmallResNet, randomize_bn  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrizations  # noqa: E402


class Discriminator(nn.Module):
    """A spectral-norm GAN discriminator (SN-GAN): strided convs, LeakyReLU, a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.LeakyReLU(0.2),
                                   nn.Conv2d(8, 16, 3, 2, 1), nn.LeakyReLU(0.2))
        self.fc = nn.Linear(16 * 4 * 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x).flatten(1))


class Vocoder(nn.Module):
    """A weight-norm Conv1d stack (HiFi-GAN's, wav2vec2's positional conv) with a
    BatchNorm1d after one conv and a weight-norm linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Conv1d(4, 8, 7, padding=3)
        self.bn = nn.BatchNorm1d(8)
        self.res = nn.Conv1d(8, 8, 3, padding=1, dilation=1)
        self.act = nn.LeakyReLU(0.1)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.pre(x))
        h = h + self.res(self.act(h))
        return self.head(h.transpose(1, 2))


def _weight_norm(model: Vocoder) -> None:
    for m in (model.pre, model.res, model.head):
        parametrizations.weight_norm(m)


def _spectral_norm(model: Discriminator) -> None:
    torch.manual_seed(3)  # the power iteration's random start, the same for both models
    for m in (model.convs[0], model.convs[2], model.fc):
        parametrizations.spectral_norm(m)


CASES = {
    "spectral_norm": (Discriminator, _spectral_norm, (2, 3, 16, 16)),
    "weight_norm": (lambda: randomize_bn(Vocoder()), _weight_norm, (2, 4, 12)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("case", list(CASES))
def test_parametrized_weights_train_as_eager(case, when, mode):
    """spectral_norm runs a power iteration on each read of the weight in training: the
    patched conv and linear read it twice a call, so u, v, the weight and every gradient
    drifted from eager's. A module parametrized before patch was left to torch, and said
    nowhere; now it is covered (a parametrized Conv1d + BatchNorm1d folds as a Conv1d)."""
    make, parametrize, shape = CASES[case]
    torch.manual_seed(0)
    ref = make().train(mode == "train")
    model = copy.deepcopy(ref)
    x = torch.randn(shape)
    if when == "before":
        parametrize(ref)
        parametrize(model)
        report = dt.patch(model)
        covered = {c.name for c in report.covered}
        assert {"fc"} <= covered if case == "spectral_norm" else {"pre", "res", "head"} <= covered
    else:
        dt.patch(model)
        with torch.no_grad():
            model(x)
            ref(x)
        parametrize(ref)
        parametrize(model)
    for _ in range(2):
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
        torch.testing.assert_close(bb, ba, msg=n)  # spectral_norm's u and v among them


@pytest.mark.parametrize("tensor", ["running_var", "bn_bias", "conv_bias", "bn_weight"])
def test_a_data_assignment_after_patch_is_folded_in(tensor):
    """``t.data = new`` keeps t's version counter: a folded conv + BN whose BN statistics,
    BN parameters or conv bias were swapped that way kept the old fold (0.2-0.5 off)."""
    torch.manual_seed(0)
    ref = randomize_bn(SmallResNet()).eval()
    ref.stem[0].bias = nn.Parameter(torch.zeros(16))
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model(x)
    new = torch.rand(16) + 2
    for m in (ref, model):
        target = {"running_var": m.stem[1].running_var, "bn_bias": m.stem[1].bias,
                  "conv_bias": m.stem[0].bias, "bn_weight": m.stem[1].weight}[tensor]
        target.data = new.clone()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))


def test_a_float64_model_folds_in_float64():
    """The conv + BN fold ran in float32 whatever the weights' dtype: a float64 model was
    off by 6.5e-8, float32's rounding."""
    torch.manual_seed(0)
    ref = randomize_bn(SmallResNet()).eval().double()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-12, atol=1e-12)


def _change(model: nn.Module, how: str, state: dict) -> None:
    if how == "load_state_dict":
        model.load_state_dict(state)
    elif how == "in_place":  # an EMA update, a no_grad fine-tuning step
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
            for n, b in model.named_buffers():
                if n.endswith("running_var"):
                    b.mul_(2.0)
    elif how == "new_parameter":
        model.block1.bn2.weight = nn.Parameter(torch.full((4,), 2.0))
    else:  # "bfloat16"
        model.to(torch.bfloat16)


@pytest.mark.parametrize("how", ["load_state_dict", "in_place", "new_parameter", "bfloat16"])
def test_a_compiled_model_uses_the_weights_it_has_now(how):
    """A compiled graph of a patched inference model read the conv + BN fold taken when
    the model was patched (refreshed by eager calls only): after load_state_dict (patch,
    then load the checkpoint, then compile), an in-place update or a new parameter it
    computed with the old weights (up to 2.2 off), and after .to(torch.bfloat16) it
    failed ("Input type (c10::BFloat16) and bias type (float) should be the same")."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = randomize_bn(SmallResNet()).eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))
        state = randomize_bn(SmallResNet(), seed=5).state_dict()
        for m in (ref, model):
            _change(m, how, state)
        if how == "bfloat16":
            x = x.bfloat16()
        torch.testing.assert_close(compiled(x), ref(x), rtol=2e-2 if how == "bfloat16" else None,
                                   atol=2e-2 if how == "bfloat16" else None)
    torch._dynamo.reset()


def test_inductor_freezing_folds_once_and_equals_eager():
    """torch._inductor.config.freezing = True (weights fixed after compile, torch's
    contract): inductor computes the graph's fold at compile time, and the frozen patched
    model computes what eager does."""
    pytest.importorskip("torch._inductor")
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = randomize_bn(SmallResNet()).eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        got = torch.compile(model)(x)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(got, ref(x), rtol=1e-4, atol=1e-5)


def test_subclasses_of_covered_modules_are_reported_as_left_to_torch():
    """A model's own Conv2d / Linear subclass (timm's Conv2dSame, a LoRA Linear) and
    SyncBatchNorm run torch's forward: they were missing from the report altogether, as if
    the model had no such layer; now report.skipped says why."""
    class StdConv2d(nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = (self.weight - self.weight.mean((1, 2, 3), keepdim=True))
            return self._conv_forward(x, w, self.bias)

    model = nn.Sequential(StdConv2d(3, 4, 3), nn.SyncBatchNorm(4), nn.ReLU(),
                          nn.MultiheadAttention(4, 2)).eval()
    report = dt.patch(model)
    skipped = {s.name: s.reason for s in report.skipped}
    assert "subclass of Conv2d" in skipped["0"]
    assert "SyncBatchNorm" in skipped["1"]
    assert "3.out_proj" not in skipped  # MultiheadAttention's own Linear: not a layer of its own
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        got = model[:3](x)
        dt.unpatch(model)
        torch.testing.assert_close(got, model[:3](x))


_SETTINGS = {
    "conv_stride": lambda m: setattr(m[3], "stride", (2, 2)),
    "conv_dilation": lambda m: (setattr(m[3], "dilation", (2, 2)), setattr(m[3], "padding", (2, 2))),
    "fused_conv_stride": lambda m: setattr(m[0], "stride", (2, 2)),
    "fused_gelu_approximate": lambda m: setattr(m[1], "approximate", "tanh"),
    "leaky_relu_slope": lambda m: setattr(m[4], "negative_slope", 0.5),
    "max_pool_window": lambda m: (setattr(m[2], "kernel_size", 3), setattr(m[2], "stride", 1)),
    "avg_pool_window": lambda m: (setattr(m[5], "kernel_size", 4), setattr(m[5], "stride", 4)),
}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("trace", [True, False], ids=["traced", "modules"])
@pytest.mark.parametrize("setting", list(_SETTINGS))
def test_module_settings_changed_after_patch_are_used(setting, trace, mode):
    """A conv's stride / padding / dilation, a pool's window and an activation's setting
    were baked into the module's dnnctl forward when patched: changed afterwards (a
    backbone dilated for segmentation), the patched model kept the old ones (another
    output shape, or 0.3 off); a fused GELU kept its form."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 8, 3, padding=1), nn.LeakyReLU(0.1), nn.AvgPool2d(2))
    ref.train(mode == "train")
    model = copy.deepcopy(ref)
    dt.patch(model, trace=trace)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model(x)
        for m in (ref, model):
            _SETTINGS[setting](m)
        torch.testing.assert_close(model(x), ref(x))


def test_a_batch_norm_eps_changed_after_patch_is_folded_in():
    """The eager fold's staleness stamp had the tensors only: a BN eps set after patch (a
    model loaded with another framework's eps) kept the old fold."""
    torch.manual_seed(0)
    ref = randomize_bn(SmallResNet()).eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model(x)
        for m in (ref, model):
            m.stem[1].eps = 0.5
        torch.testing.assert_close(model(x), ref(x))
