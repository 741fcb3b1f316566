"""dnnctl.torch.patch on small real models (CPU, numpy backend): outputs equal the
unpatched model, the report names what was fused and skipped, training keeps autograd and
BatchNorm statistics, and unpatch restores the model exactly."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import Bottleneck, LlamaBlock, SmallResNet, ViTBlock, randomize_bn  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dnnctl.errors import UsageError  # noqa: E402


def _randomize_bn(model: nn.Module) -> nn.Module:
    return randomize_bn(model, kinds=(nn.BatchNorm2d,))


MODELS = {
    "resnet": (lambda: _randomize_bn(SmallResNet()), (2, 3, 16, 16)),
    "vit": (ViTBlock, (2, 5, 32)),
    "llama": (LlamaBlock, (2, 6, 32)),
}


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _forward_backward(ref, model, x):
    """Both models forward on their own copy of x, then backward one random gradient:
    (ref's output, the patched model's, ref's input, the patched model's input)."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = ref(xa), model(xb)
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g)
    return want, got, xa, xb


def _assert_same_grads(ref, model, xa, xb, tol=(None, None), param_tol=(None, None)):
    """The input gradients and every parameter's gradient of the patched model equal ref's
    ((rtol, atol) pairs; None: assert_close's defaults)."""
    torch.testing.assert_close(xb.grad.float(), xa.grad.float(), rtol=tol[0], atol=tol[1])
    for (n, pa), pb in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(pb.grad.float(), pa.grad.float(), rtol=param_tol[0],
                                   atol=param_tol[1], msg=n)


def _eager_and_patched(model, x, **patch_kwargs):
    """(eager output, patched output, the patch report) of one inference call."""
    with torch.no_grad():
        want = model(x)
        with dt.patched(model, **patch_kwargs) as report:
            got = model(x)
    return want, got, report



@pytest.mark.parametrize("name", list(MODELS))
def test_patched_inference_equals_eager_and_unpatch_restores(name):
    torch.manual_seed(0)
    make, shape = MODELS[name]
    model = make().eval()
    x = torch.randn(*shape)
    before = _state(model)
    want, got, report = _eager_and_patched(model, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # attention (where this dnnctl has it) takes only 16-bit tensors: float32 runs torch's
    assert report.traced and report.covered
    assert [k for k in report.fallbacks() if k[0] != "attention"] == []
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert not dt.patch_module.is_patched(model)


def test_bottleneck_report_names_the_fused_chains():
    model = _randomize_bn(Bottleneck(16, 4)).eval()
    report = dt.patch(model)
    try:
        fused = {f.head: f.parts for f in report.fusions}
        # conv1/conv2 take their BN and the (shared) ReLU; conv3 its BN, the residual add and
        # the ReLU after it: relu(bn3(conv3(x)) + identity), residual_before_act
        assert fused == {"conv1": ["bn", "relu"], "conv2": ["bn", "relu"],
                         "conv3": ["bn", "residual", "relu"]}
        assert {c.name for c in report.covered} >= {"conv1", "bn1", "relu", "conv3"}
        assert "fused conv3 + bn + residual" in report.summary()
        with torch.no_grad():
            x = torch.randn(2, 16, 6, 6)
            got = model(x)
        dt.unpatch(model)
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    finally:
        if dt.patch_module.is_patched(model):
            dt.unpatch(model)


def test_channels_last_model_keeps_the_format():
    torch.manual_seed(0)
    model = _randomize_bn(Bottleneck(16, 4)).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    want, got, report = _eager_and_patched(model, x)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert report.fallbacks() == {}
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_training_mode_gradients_and_running_stats_match_torch():
    torch.manual_seed(0)
    ref = _randomize_bn(SmallResNet()).train()
    model = _randomize_bn(SmallResNet()).train()
    model.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 12, 12)
    ref(x).square().mean().backward()
    with dt.patched(model) as report:
        model(x).square().mean().backward()
    assert not any("bn" in f.parts for f in report.fusions)  # no folding in training
    assert report.fallbacks() == {}
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4, msg=n)


def test_mode_switch_after_patching_runs_the_models_own_forward():
    torch.manual_seed(0)
    model = _randomize_bn(Bottleneck(16, 4)).eval()
    x = torch.randn(2, 16, 6, 6)
    with dt.patched(model):
        model.train()  # the graph was traced (and BN folded) in eval
        got = model(x)
    ref = _randomize_bn(Bottleneck(16, 4)).train()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(got, ref(x), rtol=1e-4, atol=1e-4)


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pad_conv = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.act = nn.SiLU()

    def forward(self, x):
        y = self.act(self.conv(x))
        if y.sum() > 0:  # data-dependent control flow: fx cannot trace this
            y = self.pad_conv(y)
        return self.pool(y)[0]


def test_untraceable_model_is_patched_module_by_module_with_reasons():
    torch.manual_seed(0)
    model = _Untraceable().eval()
    x = torch.randn(1, 3, 8, 8)
    want, got, report = _eager_and_patched(model, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not report.traced and "not traceable" in report.trace_error
    assert {c.name for c in report.covered} == {"conv", "act"}
    reasons = {s.name: s.reason for s in report.skipped}
    assert reasons == {"pad_conv": "padding_mode 'reflect' (dnnctl pads with zeros)",
                       "pool": "return_indices=True"}


def test_patch_twice_and_unpatch_unpatched_are_usage_errors():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    dt.patch(model)
    with pytest.raises(UsageError, match="already patched"):
        dt.patch(model)
    dt.unpatch(model)
    with pytest.raises(UsageError, match="not patched"):
        dt.unpatch(model)


@pytest.mark.parametrize("first", ["outer", "inner"])
def test_patches_do_not_nest(first):
    """Patching a part of a patched model, or a model around a patched part, is refused
    naming the module (unpatching them out of order left dnnctl forwards behind); after
    unpatch the model is plain again and patches anew."""
    inner = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model = nn.Sequential(inner, nn.Flatten(), nn.Linear(144, 3)).eval()
    dt.patch(model if first == "outer" else inner)
    with pytest.raises(UsageError, match="already routed by another dnnctl.torch.patch"):
        dt.patch(inner if first == "outer" else model)
    dt.unpatch(model if first == "outer" else inner)
    assert not [n for n, m in model.named_modules() if "forward" in m.__dict__]
    dt.patch(inner if first == "outer" else model)


def test_a_copy_of_a_patched_part_can_be_unpatched_and_patched():
    """copy.deepcopy(model.backbone) of a patched model carries dnnctl forwards without a
    patch of its own: unpatch takes them off, and the copy patches anew."""
    model = nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4),
                                        nn.ReLU()), nn.Flatten()).eval()
    dt.patch(model)
    part = copy.deepcopy(model[0])
    with pytest.raises(UsageError, match="already routed"):
        dt.patch(part)
    dt.unpatch(part)
    assert not [n for n, m in part.named_modules() if "forward" in m.__dict__]
    x = torch.randn(1, 4, 6, 6)
    want = part(x)
    dt.patch(part)
    torch.testing.assert_close(part(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(UsageError, match="not patched"):
        dt.unpatch(nn.Linear(2, 2))


def test_compile_fullgraph_over_a_patched_model():
    torch.manual_seed(0)
    model = ViTBlock().eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = model(x)
        with dt.patched(model):
            compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
            got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_fused_conv_follows_a_replaced_stride_or_padding():
    """FusedConv keeps the op's geometry arguments between calls; assigning the conv's
    stride / padding anew (a surgery after patch) is seen on the next call."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad(), dt.patched(model):
        model(x)
        model[0].stride, model[0].padding = (2, 2), (0, 0)
        got = model(x)
    with torch.no_grad():
        want = model(x)
    assert got.shape == want.shape == (2, 8, 4, 4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_compiled_graph_folds_from_the_parameters():
    """A compiled graph computes the conv + BN fold from the conv and BN tensors at each
    call: its inputs are the model's own parameters and buffers, never a fold dnnctl kept
    (which no eager code refreshes between compiled calls)."""
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16)).eval()
    x = torch.randn(2, 8, 6, 6)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(t for t in example_inputs if isinstance(t, torch.Tensor))
        return gm

    with torch.no_grad(), dt.patched(model):
        want = model(x)
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend=backend)(x)
    torch.testing.assert_close(got, want)
    own = {t.data_ptr() for t in (*model.parameters(), *model.buffers())}
    assert {t.data_ptr() for t in seen if t.shape != x.shape} <= own


def test_a_compiled_patched_model_compiles_once_with_few_guards():
    """The traced conv folds from the parameters (not the eager staleness stamp) and reads
    the geometry from the module: the second call reuses the first graph (the eager caches
    of the fold and the geometry, set by the first call, must not fail a guard and
    recompile)."""
    torch.manual_seed(0)
    model = SmallResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    want = model(x).detach()
    with dt.patched(model):  # grad enabled, parameters require grad
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        with torch.no_grad():
            for _ in range(3):
                got = compiled(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(graphs) == 1


def test_a_compiled_eval_model_back_propagates_through_a_folded_conv():
    """Grad enabled under compile: the fold is traced with autograd, so the conv and BN
    parameters get torch's gradients (the snapshot has no graph to them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 7, 7)
    model(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch.no_grad():  # patched without grad: the inference snapshot exists
        dt.patch(model)
    torch._dynamo.reset()
    torch.compile(model, backend="aot_eager")(x).square().sum().backward()
    torch._dynamo.reset()
    dt.unpatch(model)
    for p, w in zip(model.parameters(), want):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["resnet channels_last", "llama"])
def test_inductor_compiles_patched_models_and_checks_every_extern_layout(case):
    """Inductor (not aot_eager) asserts each extern op's output strides against its fake
    kernel's: every dnnctl op a patched model runs must return exactly the layout its fake
    promises (conv2d channels-last, pooling, linear, norms, SDPA's attention)."""
    torch.manual_seed(0)
    if case == "llama":
        model, x = LlamaBlock().eval(), torch.randn(2, 6, 32)
    else:
        model = _randomize_bn(SmallResNet()).eval().to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = model(x)
        with dt.patched(model) as report:
            torch._dynamo.reset()
            got = torch.compile(model, fullgraph=True)(x)
    assert report.covered and report.fallbacks() == {}
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_plan_argument_is_used_by_the_patched_calls():
    class Spy:
        def __init__(self):
            self.seen = set()

        def lookup(self, problem, backend, device):
            self.seen.add(problem.op)
            return None

    spy = Spy()
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)).eval()
    with torch.no_grad(), dt.patched(model, spy):
        model(torch.randn(3, 8))
    assert spy.seen == {"matmul", "layer_norm"}  # linear + gelu fused into one matmul


def test_folded_weights_follow_in_place_updates_of_the_model():
    torch.manual_seed(0)
    model = _randomize_bn(Bottleneck(16, 4)).eval()
    other = _randomize_bn(Bottleneck(16, 4)).eval()
    with torch.no_grad():
        other.bn2.running_mean.add_(1.0)
        other.conv1.weight.mul_(2.0)
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad(), dt.patched(model) as report:
        model(x)
        model.load_state_dict(other.state_dict())  # copies in place: versions change
        got = model(x)
    assert any(f.head == "conv2" and "bn" in f.parts for f in report.fusions)
    with torch.no_grad():
        torch.testing.assert_close(got, other(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("trace", [True, False], ids=["traced", "modules"])
def test_eval_after_training_calls_folds_the_new_running_statistics(trace, grad):
    """Validate, train, validate: the training calls' BatchNorm kernels write the running
    statistics through their memory, and the next inference call folds the new ones (the
    fold keys on the tensors' versions, which the kernel bumps as torch's batch_norm
    does; the stale fold was 0.4 off)."""
    torch.manual_seed(0)
    ref = _randomize_bn(Bottleneck(16, 4)).eval()
    model = copy.deepcopy(ref)
    dt.patch(model, trace=trace)
    x = torch.randn(2, 16, 6, 6)
    for step in range(2):
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)
        ref.train(), model.train()
        with torch.set_grad_enabled(grad):
            y = torch.randn(2, 16, 6, 6) * (2 + step) + 1
            ref(y), model(y)
        ref.eval(), model.eval()
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)


def test_sdpa_is_routed_to_dnnctl_attention():
    """A LLaMA block's F.scaled_dot_product_attention runs torch.ops.dnnctl.attention (the
    real op: numpy backend, fp16) and gives eager's result."""
    torch.manual_seed(0)
    model = LlamaBlock().eval().half()
    x = torch.randn(2, 6, 32).half()
    want, got, report = _eager_and_patched(model, x)
    assert [c.op for c in report.covered if c.module == "scaled_dot_product_attention"] == [
        "attention"]
    assert not [s for s in report.skipped if s.module == "scaled_dot_product_attention"]
    assert not [k for k in report.fallbacks() if k[0] == "attention"]
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-3, atol=3e-3)


class _Optional(nn.Module):
    """A block with optional inputs, as diffusion UNets (a timestep embedding) and
    transformer layers (a mask) have: ``forward(x, temb=None, scale=1.0, *, double=False)``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, 8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.t = nn.Linear(6, 8)

    def forward(self, x, temb=None, scale=1.0, *, double=False):
        h = self.conv(nn.functional.silu(self.norm(x)))
        if temb is not None:
            h = h + self.t(temb)[:, :, None, None]
        if double:
            h = h * 2
        return (x + h) * scale


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_optional_arguments_run_the_traced_graph_or_the_models_forward(mode):
    """The graph is traced with the optional arguments at their defaults; a call that gives
    them runs the model's own forward (its modules still on dnnctl): every form of the call
    equals the unpatched model."""
    torch.manual_seed(0)
    model = getattr(_Optional(), mode)()
    x, temb = torch.randn(2, 8, 5, 7), torch.randn(2, 6)
    calls = [((x,), {}), ((x, temb), {}), ((x,), {"temb": temb, "scale": 0.5}),
             ((x, None, 1.0), {}), ((x,), {"double": True}), ((x,), {"double": False})]
    with torch.no_grad():
        want = [model(*a, **k) for a, k in calls]
        with dt.patched(model) as report:
            got = [model(*a, **k) for a, k in calls]
            with pytest.raises(TypeError):
                model(x, temb, 1.0, True)  # keyword-only: the model's own error
    assert report.traced and {c.name for c in report.covered} >= {"norm", "conv", "t"}
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=f"call {i}")


class _C2f(nn.Module):
    """YOLOv8's C2f split: a channels-last tensor cut in two along channels (strided views)
    feeding further convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.cv1 = nn.Conv2d(8, 16, 1)
        self.m = nn.Conv2d(8, 8, 3, padding=1)
        self.act = nn.SiLU()
        self.cv2 = nn.Conv2d(24, 8, 1)

    def forward(self, x):
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat([a, b, self.act(self.m(b))], 1))


def test_channel_slices_of_channels_last_tensors_stay_channels_last():
    """A channel slice of channels-last storage is channels-last to torch (its convolution
    keeps the format); the patched model keeps it too, so a channels-last model does not
    turn NCHW halfway (and pay layout copies on every later layer)."""
    from dnnctl.torch._tensors import is_nhwc

    cl = torch.channels_last
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=cl)
    a, b = x.chunk(2, 1)
    assert is_nhwc(x) and is_nhwc(a) and is_nhwc(b) and is_nhwc(x[:, :, 1:])
    assert not is_nhwc(x[..., ::2])  # W strided past the channels: torch says NCHW too
    assert not is_nhwc(torch.randn(2, 8, 5, 7)[:, :4])
    assert not is_nhwc(torch.randn(3, 8, 1, 1).contiguous(memory_format=cl))  # ambiguous
    torch.manual_seed(0)
    model = _C2f().eval().to(memory_format=cl)
    inp = torch.randn(2, 8, 6, 9).contiguous(memory_format=cl)
    with torch.no_grad():
        want = model(inp)
        with dt.patched(model) as report:
            got = model(inp)
    assert len(report.covered) == 4
    assert got.is_contiguous(memory_format=cl) and want.is_contiguous(memory_format=cl)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_deep_copy_of_a_patched_model_computes_with_its_own_weights(mode):
    """copy.deepcopy of a patched model (an EMA model, an evaluation copy) is a patched model
    of its own: its forwards read the copy's parameters and update the copy's running
    statistics, never the original's; the original is untouched; unpatch works on both."""

    torch.manual_seed(0)
    ref = getattr(_randomize_bn(SmallResNet()), mode)()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 3, 16, 16)
    report = dt.patch(model)
    assert report.traced
    twin, ref_twin = copy.deepcopy(model), copy.deepcopy(ref)
    with torch.no_grad():
        for m in (twin, ref_twin):
            for p in m.parameters():
                p.mul_(0.5)
    before = _state(model)
    with torch.no_grad():
        got, want = twin(x), ref_twin(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no stats or weights moved
    if mode == "train":
        for (n, a), b in zip(ref_twin.named_buffers(), twin.buffers()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    with torch.no_grad():  # the second call runs the copy's own traced graph
        torch.testing.assert_close(twin(x), want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
    assert dt.patch_module.is_patched(twin)
    dt.unpatch(twin)
    assert not any("forward" in m.__dict__ for m in twin.modules())
    dt.unpatch(model)
    # one patched module copied on its own reads its own weight
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    dt.patch(model)
    alone = copy.deepcopy(conv)
    with torch.no_grad():
        alone.weight.mul_(-1)
        torch.testing.assert_close(alone(x), -conv(x), rtol=1e-5, atol=1e-5)


class _GqaAttention(nn.Module):
    """LLaMA-style grouped-query attention through F.scaled_dot_product_attention."""

    def __init__(self, gqa: bool = True) -> None:
        super().__init__()
        self.q, self.kv, self.gqa = nn.Linear(32, 32), nn.Linear(32, 16), gqa

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 8).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 1, 8).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=self.gqa)


def test_grouped_query_sdpa_runs_dnnctl_attention():
    """enable_gqa=True (4 query heads over 1 key head): routed to dnnctl.ops.attention (the
    real op, numpy backend, fp16), equal to torch's; without the flag, torch's own answer."""
    torch.manual_seed(0)
    model = _GqaAttention().eval().half()
    x = torch.randn(2, 7, 32).half()
    want, got, report = _eager_and_patched(model, x)
    assert [c.op for c in report.covered if c.module == "scaled_dot_product_attention"] == [
        "attention"]
    assert not [k for k in report.fallbacks() if k[0] == "attention"]
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    plain = _GqaAttention(gqa=False).eval().half()  # torch broadcasts the one key head
    with torch.no_grad():
        want = plain(x)
        with dt.patched(plain):
            torch.testing.assert_close(plain(x), want)


class _InvertedResidual(nn.Module):
    """MobileNetV2's block (ReLU6) with MobileNetV3's Hardswish and Hardsigmoid gate."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32),
                                    nn.ReLU6(inplace=True))
        self.dw = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1, groups=32, bias=False),
                                nn.BatchNorm2d(32), nn.Hardswish())
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(32, 32, 1),
                                  nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(32, 8, 1, bias=False), nn.BatchNorm2d(8))

    def forward(self, x):
        h = self.dw(self.expand(x))
        return x + self.project(h * self.gate(h))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_mobilenet_activations_run_on_dnnctl_and_fuse_into_the_conv(mode):
    """ReLU6 / Hardswish / Hardsigmoid are dnnctl activations; in inference conv + BN +
    ReLU6 / Hardswish is one convolution with the activation in its epilogue."""
    torch.manual_seed(0)
    ref = getattr(_randomize_bn(_InvertedResidual()), mode)()

    model = copy.deepcopy(ref)
    x = torch.randn(2, 8, 9, 7)
    report = dt.patch(model)
    acts = {c.note for c in report.covered if c.op == "activation"}
    assert acts == {"relu6", "hardswish", "hardsigmoid"}
    if mode == "eval":
        parts = sorted(tuple(f.parts) for f in report.fusions)
        assert ("bn", "hardswish") in parts and ("bn", "relu6") in parts
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)
        return
    ya, yb, xa, xb = _forward_backward(ref, model, x)
    torch.testing.assert_close(yb, ya, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-3, 1e-4))


ODD_MODULES = [
    ("conv2d unbatched", lambda: nn.Conv2d(3, 4, 3, padding=1), (3, 8, 8)),
    ("group_norm (N, C, L)", lambda: nn.GroupNorm(2, 4), (2, 4, 10)),
    ("group_norm 5-D", lambda: nn.GroupNorm(2, 4), (2, 4, 3, 5, 6)),
    ("max_pool unbatched", lambda: nn.MaxPool2d(2), (3, 8, 8)),
    ("global pool unbatched", lambda: nn.AdaptiveAvgPool2d(1), (3, 8, 8)),
    ("adaptive pool (None, 1)", lambda: nn.AdaptiveAvgPool2d((None, 1)), (2, 3, 8, 8)),
    ("adaptive pool (1,): torch's error", lambda: nn.AdaptiveAvgPool2d((1,)), (2, 3, 8, 8)),
    ("softmax dim 0", lambda: nn.Softmax(0), (3, 5)),
    ("log_softmax dim -2", lambda: nn.LogSoftmax(-2), (2, 3, 4)),
    ("linear 1-D", lambda: nn.Linear(5, 3), (5,)),
    ("linear 4-D", lambda: nn.Linear(5, 3), (2, 3, 4, 5)),
    ("layer_norm 1-D", lambda: nn.LayerNorm(5), (5,)),
    ("batch_norm2d 3-D: torch's error", lambda: nn.BatchNorm2d(3), (3, 4, 4)),
    ("max_pool dilation 2", lambda: nn.MaxPool2d(3, 1, 1, dilation=2), (1, 2, 9, 9)),
    ("avg_pool ceil, pad counted", lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True), (1, 2, 6, 7)),
    ("conv padding past the filter", lambda: nn.Conv2d(2, 2, 3, padding=4), (1, 2, 5, 5)),
    ("conv 'same', even filter", lambda: nn.Conv2d(2, 2, 4, padding="same"), (1, 2, 7, 7)),
    ("conv empty batch", lambda: nn.Conv2d(2, 2, 3), (0, 2, 7, 7)),
    ("leaky_relu 0-D", lambda: nn.LeakyReLU(0.3), ()),
]


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("case", range(len(ODD_MODULES)), ids=[c[0] for c in ODD_MODULES])
def test_odd_inputs_and_settings_behave_as_torch(case, mode):
    """Inputs torch's modules take that dnnctl's kernels may not (unbatched, other ranks,
    empty, 0-D) and settings it does not run: the patched module gives torch's result, or
    raises torch's error type; patch itself never fails on them."""

    _, make, shape = ODD_MODULES[case]
    torch.manual_seed(0)
    ref = getattr(make(), mode)()
    model = copy.deepcopy(ref)
    x = torch.randn(shape)
    try:
        want = ref(x.clone())
    except Exception as exc:  # noqa: BLE001  (the type torch raises is the expectation)
        want = exc
    with dt.patched(model):
        if isinstance(want, Exception):
            with pytest.raises(type(want)):
                model(x.clone())
            return
        got = model(x.clone())
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


MORE_MODULES = [
    ("conv1d", lambda: nn.Conv1d(6, 8, 3, padding=1), (2, 6, 17)),
    ("conv1d stride 2 (Whisper)", lambda: nn.Conv1d(6, 8, 3, stride=2, padding=1), (2, 6, 30)),
    ("conv1d 'same' even filter, dilation", lambda: nn.Conv1d(4, 4, 4, padding="same",
                                                             dilation=2), (2, 4, 15)),
    ("conv1d depthwise causal-style", lambda: nn.Conv1d(8, 8, 4, padding=3, groups=8),
     (2, 8, 11)),
    ("conv1d unbatched, no bias", lambda: nn.Conv1d(3, 5, 5, bias=False), (3, 20)),
    ("batch_norm1d (N, C)", lambda: nn.BatchNorm1d(6), (5, 6)),
    ("batch_norm1d (N, C, L)", lambda: nn.BatchNorm1d(6, affine=False), (4, 6, 7)),
    ("instance_norm2d", lambda: nn.InstanceNorm2d(5), (2, 5, 6, 7)),
    ("instance_norm2d affine, unbatched", lambda: nn.InstanceNorm2d(5, affine=True),
     (5, 6, 7)),
    ("instance_norm1d", lambda: nn.InstanceNorm1d(6, affine=True), (3, 6, 11)),
    ("instance_norm1d unbatched", lambda: nn.InstanceNorm1d(6), (6, 11)),
]


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("case", range(len(MORE_MODULES)), ids=[c[0] for c in MORE_MODULES])
def test_conv1d_batch_norm1d_and_instance_norm_run_on_dnnctl(case, mode):
    """nn.Conv1d (as conv2d over an (N, C, 1, L) view), BatchNorm1d and InstanceNorm2d (as
    group_norm with a group per channel) run on dnnctl: outputs, input and parameter
    gradients and running statistics equal torch's."""

    _, make, shape = MORE_MODULES[case]
    torch.manual_seed(0)
    ref = getattr(make(), mode)()
    if isinstance(ref, nn.BatchNorm1d):
        with torch.no_grad():
            ref.running_mean.uniform_(-0.5, 0.5)
            ref.running_var.uniform_(0.5, 1.5)
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert len(report.covered) == 1 and not report.skipped
    ya, yb, xa, xb = _forward_backward(ref, model, torch.randn(shape))
    torch.testing.assert_close(yb, ya, rtol=1e-4, atol=1e-5)
    assert not report.fallbacks()
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))
    for (n, ba), bb in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(bb, ba, rtol=1e-5, atol=1e-6, msg=n)


def test_modules_with_hooks_are_not_fused_away():
    """A forward hook (a feature extractor, Grad-CAM) still fires on a patched model, and a
    pruned conv (its weight recomputed by a forward pre-hook) computes with the pruned
    weight: hooked modules stay out of the fused chains."""

    from torch.nn.utils import prune

    torch.manual_seed(0)
    ref = _randomize_bn(SmallResNet()).eval()
    model = copy.deepcopy(ref)
    for m in (ref, model):  # a pruned weight is not a leaf: prune after copying
        prune.l1_unstructured(m.stem[0], "weight", amount=0.5)
    seen = {}
    for m, tag in ((ref, "ref"), (model, "patched")):
        m.block1.conv2.register_forward_hook(
            lambda mod, i, o, tag=tag: seen.__setitem__(tag, o.detach().clone()))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = ref(x)
        with dt.patched(model) as report:
            got = model(x)
    heads = {f.head for f in report.fusions}
    assert "stem.0" not in heads and "block1.conv2" not in heads and heads
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(seen["patched"], seen["ref"], rtol=1e-4, atol=1e-4)


def test_traced_graph_calls_submodules_and_hooks_added_after_patch_still_fire():
    """The traced graph runs a fused chain as a FusedConv submodule (the fold an eager call
    keeps its buffers) and a covered module through a Routed submodule (what torch.compile
    guards cheaply); a hook registered on a routed module after patch still fires, with
    the patched forward's output."""
    from dnnctl.torch.fuse import FusedConv, Routed

    torch.manual_seed(0)
    model = _randomize_bn(SmallResNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = model(x)
        dt.patch(model)
        gm = model.forward.gm
        subs = {n.target: gm.get_submodule(n.target) for n in gm.graph.nodes
                if n.op == "call_module"}
        fused = [m for m in subs.values() if isinstance(m, FusedConv)]
        assert any(isinstance(m, Routed) and m.mod is model.fc for m in subs.values())
        seen = []
        model.fc.register_forward_hook(lambda mod, i, o: seen.append(o.detach().clone()))
        got = model(x)
        assert fused and all(m.folded_weight is not None for m in fused if m.bn is not None)
        dt.unpatch(model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], got)


def test_a_hook_registered_after_patch_on_a_fused_module_fires_and_counts():
    """A fused chain never calls its conv, BN or activation module: a hook put on one after
    patch (Grad-CAM, a feature extractor, a pruning pre-hook) makes the model trace again
    with that module out of the fusion, so the hook fires and what it returns is used,
    as in eager. Hooks elsewhere leave the fused graph as it is."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 36, 3), nn.GELU())
    model = _randomize_bn(model).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        report = dt.patch(model)
        assert [f.parts for f in report.fusions] == [["bn", "relu"], ["gelu"]]
        graph = model.forward.gm
        torch.zeros(1, requires_grad=True).register_hook(lambda g: g)  # not a module's
        model(x)
        assert model.forward.gm is graph
        seen = []
        for i in (0, 1, 2, 4, 5):
            model[i].register_forward_hook(lambda m, a, o, i=i: seen.append(i))
        model(x)
        assert sorted(seen) == [0, 1, 2, 4, 5]
        assert model.forward.gm is not graph
        model[1].register_forward_hook(lambda m, a, o: o * 0.5)
        got = model(x)
        dt.unpatch(model)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm"])
def test_a_conv_parametrized_after_patch_folds_its_computed_weight(kind):
    """torch.nn.utils.parametrizations on a fused conv after patch: its weight becomes a
    property computed on every read (no ``weight`` parameter left); the fused chain folds
    that weight on each call, as eager computes it, and gradients reach the parametrization."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(4), nn.ReLU())).eval()
    x = torch.randn(2, 4, 6, 6)
    dt.patch(model)
    with torch.no_grad():
        model(x)
    getattr(parametrizations, kind)(model[0])
    got = model(x)
    got.square().sum().backward()
    grads = [p.grad.clone() for p in model[0].parametrizations.parameters()]
    model.zero_grad()
    dt.unpatch(model)
    want = model(x)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, p in zip(grads, model[0].parametrizations.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


def test_export_keeps_the_dnnctl_ops_and_script_says_why_it_cannot():
    """torch.export of a patched model gives a program holding the dnnctl ops (their fake
    kernels trace it) with eager's result; torch.jit.script, which compiles Python source,
    refuses with a UsageError naming the ways out, and works again after unpatch."""
    from dnnctl.errors import UsageError

    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4),
                                        nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))).eval()
    x = torch.randn(2, 4, 6, 6)
    want = model(x)
    dt.patch(model)
    assert dt.is_patched(model)
    program = torch.export.export(model, (x,))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"dnnctl.conv2d.default", "dnnctl.linear.default"} <= ops
    torch.testing.assert_close(program.module()(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(UsageError, match="torch.jit.script cannot compile a patched model"):
        torch.jit.script(model)
    dt.unpatch(model)
    assert not dt.is_patched(model)
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(x), want, rtol=1e-5, atol=1e-6)


def test_a_gradient_that_must_be_differentiable_takes_torchs_formulas():
    """create_graph=True (a gradient penalty): dnnctl's backward kernels give no graph, so
    such a backward runs torch's formulas even with backward="dnnctl", and the second-order
    gradients equal eager's (they were missing, or an error, before); an ordinary backward
    still runs on dnnctl."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softplus(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.GELU(), nn.Flatten(),
                        nn.Linear(288, 1)).train()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 3, 6, 6)
    dt.patch(model, backward="dnnctl")

    def penalty(m: nn.Module) -> list[torch.Tensor]:
        xi = x.clone().requires_grad_(True)
        g, = torch.autograd.grad(m(xi).sum(), xi, create_graph=True)
        ((g.flatten(1).norm(dim=1) - 1) ** 2).mean().backward()
        grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        m.zero_grad()
        return grads

    before = dict(dt.BACKWARD_PATHS)
    got, want = penalty(model), penalty(ref)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    new = {k: v - before.get(k, 0) for k, v in dt.BACKWARD_PATHS.items()}
    assert new.get(("conv2d", "dgrad", "torch"), 0) > 0
    model(x).sum().backward()  # no graph wanted: dnnctl's kernels
    after = {k: v - before.get(k, 0) for k, v in dt.BACKWARD_PATHS.items()}
    assert after.get(("conv2d", "dgrad", "dnnctl"), 0) > 0


def test_a_fold_made_inside_inference_mode_serves_a_later_backward():
    """The folded conv + BN weight is kept across calls. Made (or remade after
    load_state_dict) inside torch.inference_mode, it is still a normal tensor, so a later
    call whose input requires grad (saliency on a frozen model) can save it for backward."""
    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                        nn.ReLU(), nn.Conv2d(8, 4, 1))).eval()
    model.requires_grad_(False)
    ref = copy.deepcopy(model)
    with torch.inference_mode():
        dt.patch(model)
    state = {k: v + 0.01 for k, v in ref.state_dict().items()}
    model.load_state_dict(state)
    ref.load_state_dict(state)
    x = torch.randn(2, 3, 6, 6)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-6)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref(xa).square().sum().backward()
    model(xb).square().sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backward", ["dnnctl", "plan"])
def test_training_attention_takes_dnnctls_backward_only_where_it_runs_it(backward):
    """In training, a patched SDPA runs dnnctl's forward and backward when the backward mode
    puts the attention backward on dnnctl; otherwise (no plan entry) torch's SDPA runs both
    (its fused backward beats a recomputed one). Gradients equal eager's either way."""

    torch.manual_seed(0)
    ref = LlamaBlock().train().half()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 6, 32).half()
    before = dict(dt.BACKWARD_PATHS)
    with dt.patched(model, backward=backward):
        ya, yb, xa, xb = _forward_backward(ref, model, x)
    torch.testing.assert_close(yb.float(), ya.float(), rtol=3e-3, atol=3e-3)
    _assert_same_grads(ref, model, xa, xb, (2e-2, 2e-2), (3e-2, 3e-2))
    key = ("attention", "backward", "dnnctl")
    ran = dt.BACKWARD_PATHS[key] - before.get(key, 0)
    assert ran == (1 if backward == "dnnctl" else 0)


class _ViTEncoderBlock(nn.Module):
    """torchvision's ViT encoder block: LayerNorm, nn.MultiheadAttention(x, x, x,
    need_weights=False), residual, LayerNorm, MLP."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(64)
        self.self_attention = nn.MultiheadAttention(64, 8, batch_first=batch_first)
        self.ln_2 = nn.LayerNorm(64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_self_attention_runs_on_dnnctl(batch_first):
    """nn.MultiheadAttention self-attention (torchvision's ViT): in_proj, dnnctl attention,
    out_proj, equal to torch's; calls asking for weights or masks run the module's own."""
    torch.manual_seed(0)
    model = _ViTEncoderBlock(batch_first).eval().half()
    x = torch.randn(2, 10, 64).half()
    if not batch_first:
        x = x.transpose(0, 1).contiguous()
    mha = model.self_attention
    mask = torch.zeros(10, 10, dtype=torch.bool).triu(1)
    with torch.no_grad():
        want = model(x)
        want_w = mha(x, x, x)
        want_m = mha(x, x, x, attn_mask=mask, need_weights=False)[0]
        with dt.patched(model) as report:
            got = model(x)
            got_w = mha(x, x, x)  # need_weights=True (the default): torch's, with weights
            got_m = mha(x, x, x, attn_mask=mask, need_weights=False)[0]
    assert "self_attention" in {c.name for c in report.covered}
    assert not [k for k in report.fallbacks() if k[0] == "attention"]
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-3, atol=3e-3)
    torch.testing.assert_close(got_w[0], want_w[0])
    torch.testing.assert_close(got_w[1], want_w[1])
    torch.testing.assert_close(got_m, want_m)
    ops = {p.op for p in dt.record(model, x).problems}  # what the patched block sends
    assert {"attention", "matmul", "layer_norm"} <= ops


def test_multihead_attention_it_does_not_run_is_reported():
    model = nn.Sequential(nn.MultiheadAttention(48, 4, kdim=32, vdim=32))
    report = dt.patch(model)
    (skip,) = [s for s in report.skipped if s.module == "MultiheadAttention"]
    assert "kdim" in skip.reason
    dt.unpatch(model)


def test_compile_fullgraph_traces_the_patched_attention():
    """torch.compile(fullgraph=True) over a patched fp16 LLaMA block: the SDPA is
    torch.ops.dnnctl.attention in the compiled graph (its fake kernel traced), and the
    result equals eager."""
    torch.manual_seed(0)
    model = LlamaBlock().eval().half()
    x = torch.randn(2, 6, 32).half()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    with torch.no_grad():
        want = model(x)
        with dt.patched(model):
            torch._dynamo.reset()
            got = torch.compile(model, fullgraph=True, backend=backend)(x)
    assert any("dnnctl.attention" in t for t in seen), seen
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-3, atol=3e-3)


NORM_MODULES = [
    ("layer_norm over (C, H, W)", lambda: nn.LayerNorm([6, 5, 4]), (3, 6, 5, 4)),
    ("layer_norm over (H, W), channels_last input", lambda: nn.LayerNorm([5, 4]),
     (3, 6, 5, 4)),
    ("layer_norm weight without bias", lambda: nn.LayerNorm(16, bias=False), (4, 7, 16)),
    ("rms_norm over (S, D)", lambda: nn.RMSNorm([7, 16]), (4, 7, 16)),
    ("layer_norm shape mismatch: torch's error", lambda: nn.LayerNorm([6, 5]), (3, 6, 4, 4)),
]


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("case", range(len(NORM_MODULES)), ids=[c[0] for c in NORM_MODULES])
def test_norms_over_several_trailing_dims_and_weight_only(case, mode):
    """LayerNorm / RMSNorm over several trailing dims run as rows of their product, and a
    LayerNorm with a weight but no bias runs too: outputs and gradients equal torch's."""

    _, make, shape = NORM_MODULES[case]
    torch.manual_seed(0)
    ref = getattr(make(), mode)()
    with torch.no_grad():
        for p in ref.parameters():
            p.uniform_(0.5, 1.5)
    model = copy.deepcopy(ref)
    x = torch.randn(shape)
    if "channels_last" in NORM_MODULES[case][0]:
        x = x.contiguous(memory_format=torch.channels_last)
    report = dt.patch(model)
    assert len(report.covered) == 1 and not report.skipped
    try:
        ref(x)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            model(x)
        return
    want, got, xa, xb = _forward_backward(ref, model, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))


TRANSPOSED = [
    ("stride 2 (UNet up-conv)", lambda: nn.ConvTranspose2d(8, 4, 2, stride=2), (2, 8, 5, 6)),
    ("3x3 s2 p1 output_padding 1", lambda: nn.ConvTranspose2d(6, 6, 3, 2, 1, output_padding=1),
     (2, 6, 7, 5)),
    ("groups 2, dilation 2, no bias",
     lambda: nn.ConvTranspose2d(4, 6, 3, padding=2, dilation=2, groups=2, bias=False),
     (1, 4, 6, 6)),
    ("4x4 s2 p1 (DCGAN)", lambda: nn.ConvTranspose2d(8, 4, 4, 2, 1), (2, 8, 4, 4)),
]


@pytest.mark.parametrize("fmt", ["nchw", "channels_last"])
@pytest.mark.parametrize("case", range(len(TRANSPOSED)), ids=[c[0] for c in TRANSPOSED])
def test_conv_transpose2d_runs_as_the_data_gradient(case, fmt):
    """nn.ConvTranspose2d (UNet decoders, GAN generators) runs as dnnctl's conv2d data
    gradient plus its bias: output, memory format and gradients equal torch's; an explicit
    output_size runs the module's own forward."""

    _, make, shape = TRANSPOSED[case]
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref)
    x = torch.randn(shape)
    if fmt == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
        ref, model = ref.to(memory_format=torch.channels_last), model.to(
            memory_format=torch.channels_last)
    report = dt.patch(model)
    assert [c.op for c in report.covered] == ["conv2d"]
    want, got, xa, xb = _forward_backward(ref, model, x)
    assert not report.fallbacks()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if fmt == "channels_last":
        assert got.is_contiguous(memory_format=torch.channels_last)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-4))
    size = [2 * s for s in shape[2:]] if case == 0 else None
    if size is not None:
        with torch.no_grad():
            torch.testing.assert_close(model(x, output_size=size), ref(x, output_size=size))


ADAPTIVE = [
    ("avg 7x7 of 14x14 (VGG)", lambda: nn.AdaptiveAvgPool2d((7, 7)), (2, 4, 14, 14)),
    ("avg 7x7 of 7x7: identity windows", lambda: nn.AdaptiveAvgPool2d(7), (2, 4, 7, 7)),
    ("avg 7x7 of 10x10: torch's uneven windows", lambda: nn.AdaptiveAvgPool2d(7),
     (2, 4, 10, 10)),
    ("avg (None, 1)", lambda: nn.AdaptiveAvgPool2d((None, 1)), (2, 3, 5, 6)),
    ("max 1 (global max)", lambda: nn.AdaptiveMaxPool2d(1), (2, 4, 6, 5)),
    ("max (2, 3) of 8x9", lambda: nn.AdaptiveMaxPool2d((2, 3)), (2, 4, 8, 9)),
]


@pytest.mark.parametrize("case", range(len(ADAPTIVE)), ids=[c[0] for c in ADAPTIVE])
def test_adaptive_pools_run_as_the_pool_they_equal(case):
    """Adaptive pools whose output divides the input are uniform pools (global average for
    1x1): dnnctl's pool ops, equal to torch's with gradients; uneven windows run torch's."""

    _, make, shape = ADAPTIVE[case]
    ref = make()
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert len(report.covered) == 1
    torch.manual_seed(0)
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(shape))
    torch.testing.assert_close(got, want)
    _assert_same_grads(ref, model, xa, xb)


class _FireInplace(nn.Module):
    """SqueezeNet's Fire module as torchvision writes it: in-place ReLUs on conv outputs."""

    def __init__(self):
        super().__init__()
        self.sq, self.e1, self.e3 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3,
                                                                                      padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = F.relu(self.sq(x), inplace=True)
        return torch.cat([self.act(self.e1(x)), F.relu(self.e3(x), inplace=True)], 1)


@pytest.mark.parametrize("train", [False, True])
def test_in_place_ops_on_channels_last_results_keep_autograd(train):
    """A channels-last result is the (N, C, H, W) permutation of the kernel's NHWC tensor;
    returned from the autograd op as a view, an in-place ReLU on it raised ("is a view and
    is being modified inplace") whenever the weights required grad, eval mode included."""
    torch.manual_seed(0)
    ref = _FireInplace().train(train).to(memory_format=torch.channels_last)
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 8, 6, 7).contiguous(memory_format=torch.channels_last)
    want, got, xa, xb = _forward_backward(ref, model, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _assert_same_grads(ref, model, xa, xb, tol=(1e-4, 1e-5), param_tol=(1e-4, 1e-5))


class _ReadsAfterInplaceAct(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.lin, self.act = nn.Linear(8, 8), act

    def forward(self, x):
        h = self.lin(x)
        y = self.act(h)  # in place: h is the activation's result from here on
        return h + y


@pytest.mark.parametrize("trace", [True, False])
@pytest.mark.parametrize("act", [nn.ReLU(inplace=True), nn.SiLU(inplace=True),
                                 nn.LeakyReLU(0.1, inplace=True)], ids=lambda a: type(a).__name__)
def test_inplace_activation_modules_mutate_their_input(act, trace):
    """An ``inplace=True`` activation module writes its result into its input, as torch's
    does; the patched module returned a new tensor and left h as it was (0.8 off)."""
    torch.manual_seed(0)
    model = _ReadsAfterInplaceAct(act).eval()
    x = torch.randn(4, 8)
    want, got, _ = _eager_and_patched(model, x, trace=trace)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_inplace_relu_on_a_fresh_value_runs_out_of_place_in_the_graph():
    """conv -> ReLU(inplace=True) in training (the activation stays its own op there):
    nothing else reads the conv's output, so the graph calls the out-of-place activation (no
    copy back into a dead tensor). ResNet's bn -> ReLU and relu(bn + identity) go further:
    the ReLU runs inside batch_norm's call."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(inplace=True),
                          nn.Conv2d(8, 4, 1)).train()
    dt.patch(model)
    code = model.forward.gm.code
    assert "self.1(" not in code and "dnnctl_1_out_of_place" in code, code
    block = Bottleneck(16, 4).train()
    report = dt.patch(block)
    code = block.forward.gm.code
    assert "relu" not in code.replace("dnnctl_bn", ""), code
    assert sorted(tuple(f.parts) for f in report.fusions) == [
        ("relu",), ("relu",), ("residual", "relu")]


class _AugmentedAssign(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.conv = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        h = self.stem(x)
        skip = h
        h += self.conv(h)  # skip is h: it sees the sum
        return h + skip


def test_augmented_assignment_stays_in_place():
    """fx traces ``h += y`` as ``h = h + y``, so a second name for h kept the old value
    (0.24 off eager); the patch tracer records it as the in-place add it is, and does not
    fuse it into the conv (that would drop the mutation)."""
    torch.manual_seed(0)
    model = _AugmentedAssign().eval()
    x = torch.randn(2, 4, 6, 6)
    want, got, report = _eager_and_patched(model, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not report.fusions


def test_eval_mode_backward_through_a_folded_conv_bn_reaches_the_parameters():
    """An eval-mode model that back-propagates (frozen-BN fine-tuning, saliency): the
    folded conv + BN gave x its gradient but the conv and BN parameters none."""
    torch.manual_seed(0)
    ref = _randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.Conv2d(8, 4, 1)).eval())
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert report.fusions
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(2, 3, 6, 6))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _assert_same_grads(ref, model, xa, xb, tol=(1e-4, 1e-6), param_tol=(1e-4, 1e-6))


class _ConvResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.conv(x) + x


class _ConvResidualRelu(nn.Module):
    """A ResNet block's end: relu(conv(x) + x), one call with the residual before the ReLU."""

    def __init__(self):
        super().__init__()
        self.conv, self.relu = nn.Conv2d(8, 8, 1), nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.conv(x)
        out += x
        return self.relu(out)


@pytest.mark.parametrize("make, shape, dtype", [
    (lambda: nn.LayerNorm(16), (4, 16), torch.bfloat16),
    (lambda: nn.Softmax(-1), (4, 16), torch.bfloat16),
    (lambda: nn.GroupNorm(2, 8), (2, 8, 4, 4), torch.bfloat16),
    (_ConvResidual, (2, 8, 4, 4), torch.float32),
    (_ConvResidualRelu, (2, 8, 4, 4), torch.float32),
], ids=["layer_norm", "softmax", "group_norm", "conv_fp32_residual",
        "conv_fp32_residual_before_relu"])
def test_cpu_autocast_gives_eagers_dtypes(make, shape, dtype):
    """torch's CPU autocast has no float32 entry for norms and softmax (they stay bfloat16;
    the dnnctl ops returned float32), and a float32 residual added to an autocast conv
    keeps the sum float32 (the fused conv rounded the residual stream to bfloat16)."""
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(shape, dtype=dtype) * 10
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        with dt.patched(model):
            got = model(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2)


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.sm = nn.Linear(16, 16), nn.Softmax(-1)
        self.register_buffer("pos", torch.randn(5, 16))
        self.temperature = 1.0

    def forward(self, x):
        return self.sm((self.lin(x) + self.pos) / self.temperature)


@pytest.mark.parametrize("change", ["attribute", "buffer", "module", "to_bf16"])
def test_changes_to_the_model_after_patch_are_seen(change):
    """The traced graph holds the modules and tensors it read and has plain attributes
    baked in: a temperature, a reassigned buffer, a new head, ``.to(bfloat16)`` after
    patch() were ignored (0.6-1.8 off eager). The forward checks what the graph read and
    traces again when it changed."""
    torch.manual_seed(0)
    model = _Scaled().eval()
    x = torch.randn(2, 5, 16)
    dt.patch(model)
    with torch.no_grad():
        model(x)
        if change == "attribute":
            model.temperature = 0.25
        elif change == "buffer":
            model.pos = torch.zeros(5, 16)
        elif change == "module":
            model.lin = nn.Linear(16, 16)
        else:
            model.bfloat16()
            x = x.bfloat16()
        got = model(x)
        assert type(model.forward).__name__ == "_Traced" and model.forward.retraces == 1
        dt.unpatch(model)
        want = model(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_an_attribute_changed_on_every_call_ends_in_the_models_own_forward():
    """After 8 traces the patched model runs its own forward (modules still on dnnctl)."""
    model = _Scaled().eval()
    dt.patch(model)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        for i in range(12):
            model.temperature = 1.0 + i
            got = model(x)
        assert type(model.forward).__name__ == "method"
        dt.unpatch(model)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)


def test_report_says_when_torch_runs_a_transformer_layer_or_an_attention_call():
    """torch's TransformerEncoderLayer fast path runs the whole layer in inference (its
    covered parts do not run), and a MultiheadAttention call dnnctl cannot take runs the
    module's own forward: both are said, not counted as dnnctl's."""
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.attn(self.layer(x), x, x, need_weights=False)[0]

    model = Wrap().eval()
    x = torch.randn(2, 5, 32)
    want, got, report = _eager_and_patched(model, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert [s.module for s in report.skipped] == ["TransformerEncoderLayer"]
    assert "fast path" in report.skipped[0].reason
    assert any(op == "multihead_attention" and "cross-attention" in why
               for op, why in report.fallbacks())


class _ConformerConv(nn.Module):
    """Whisper's front end (conv1d + GELU, stride 2) and a Conformer conv module (depthwise
    conv1d 'same' + BatchNorm1d + SiLU, pointwise + residual)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(8, 16, 3, padding=1), nn.Conv1d(16, 16, 3, 2, padding=1)
        self.gelu = nn.GELU()
        self.dw = nn.Conv1d(16, 16, 7, padding="same", groups=16, bias=False)
        self.bn, self.act, self.pw = nn.BatchNorm1d(16), nn.SiLU(), nn.Conv1d(16, 16, 1)

    def forward(self, x):
        y = self.gelu(self.c2(self.gelu(self.c1(x))))
        return self.pw(self.act(self.bn(self.dw(y)))) + y


def test_conv1d_chains_fuse_like_conv2d():
    torch.manual_seed(0)
    ref = _ConformerConv().eval()
    with torch.no_grad():
        ref.bn.running_mean.uniform_(-1, 1)
        ref.bn.running_var.uniform_(0.5, 2)
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert [f.parts for f in report.fusions] == [["gelu"], ["gelu"], ["bn", "silu"],
                                                 ["residual"]]
    for x in (torch.randn(2, 8, 20), torch.randn(2, 20, 8).transpose(1, 2)):
        want, got, xa, xb = _forward_backward(ref, model, x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        _assert_same_grads(ref, model, xa, xb, tol=(1e-4, 1e-6), param_tol=(1e-4, 1e-5))
        for p in (*model.parameters(), *ref.parameters()):
            p.grad = None


def test_block_end_relu_joins_the_conv_and_undoes():
    """relu(conv(x) + x) is one dnnctl conv2d call (residual before the activation), equal
    to eager in eval; unpatched, the module runs its own three ops again."""
    torch.manual_seed(0)
    model = _ConvResidualRelu().eval()
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        want = model(x.clone())
        report = dt.patch(model)
        assert [f.parts for f in report.fusions] == [["residual", "relu"]]
        torch.testing.assert_close(model(x.clone()), want, rtol=1e-5, atol=1e-6)
        dt.unpatch(model)
        torch.testing.assert_close(model(x.clone()), want, rtol=0, atol=0)


class _PreActBlock(nn.Module):
    """A pre-activation block (bn -> relu -> conv, twice) with an F.relu, an in-place ReLU
    module, and a BatchNorm whose output is read twice (that one cannot take the ReLU)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm2d(c), nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.conv1(F.relu(self.bn1(x)))
        h = self.conv2(self.act(self.bn2(h)))
        z = self.bn3(h)
        return F.relu(z) + z


def _patched_train_step(ref, backward):
    """A deep copy of ref patched: one forward and backward of both on the same input,
    outputs, input / parameter gradients and BatchNorm buffers checked equal; the report."""
    model = copy.deepcopy(ref)
    x = torch.randn(4, *_INPUT[type(ref)])
    with dt.patched(model, backward=backward) as report:
        want, got, xa, xb = _forward_backward(ref, model, x)
    assert report.fallbacks() == {}
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    _assert_same_grads(ref, model, xa, xb, (1e-3, 1e-4), (1e-3, 1e-4))
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    return report


_INPUT = {_PreActBlock: (8, 6, 6), Bottleneck: (16, 6, 6)}


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_then_relu_runs_as_one_fused_batch_norm(train):
    """A BatchNorm not folded into a convolution (pre-activation blocks; every one in
    training) followed by a ReLU runs as one batch_norm with its fused ReLU: the same
    outputs, running statistics and gradients as torch; a BatchNorm read twice stays apart."""
    torch.manual_seed(0)
    report = _patched_train_step(_randomize_bn(_PreActBlock()).train(train), "dnnctl")
    fused = {f.head: f.parts for f in report.fusions}
    assert fused["bn1"] == ["relu"]
    if train:
        assert fused["bn2"] == ["relu"] and "bn3" not in fused
    else:  # eval: bn2 and its ReLU fold into conv1, bn3 into conv2
        assert fused["conv1"] == ["bn", "relu"] and fused["conv2"] == ["bn"]


@pytest.mark.parametrize("backward", ["dnnctl", "torch"])
def test_training_bottleneck_runs_its_block_end_as_one_batch_norm(backward):
    """relu(bn3(conv3(h)) + identity) in training: one batch_norm with the residual and ReLU
    fused; outputs, running statistics, input and parameter gradients as eager torch, on
    both backward paths (dnnctl's kernels and torch's formulas)."""
    torch.manual_seed(0)
    report = _patched_train_step(_randomize_bn(Bottleneck(16, 4)).train(), backward)
    assert ["residual", "relu"] in [f.parts for f in report.fusions]


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_jit_trace_of_a_patched_model_records_the_dnnctl_ops(mode):
    """torch.jit.trace sees only what reaches the dispatcher: a patched model's calls take
    it while a trace runs, so the trace holds dnnctl's ops (not their results baked in as
    constants) and gives the model's output on new inputs."""
    torch.manual_seed(0)
    model = _randomize_bn(SmallResNet())
    model = model.train() if mode == "train" else model.eval()
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        traced = torch.jit.trace(model, x, check_trace=False)
    kinds = {n.kind() for n in traced.inlined_graph.nodes()}
    assert any(k.startswith("dnnctl::") for k in kinds), sorted(kinds)
    assert all(v.node().kind() != "prim::Constant" for v in traced.inlined_graph.outputs())
    if mode == "eval":
        x2 = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(traced(x2), model(x2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_torch_func_vmap_over_a_patched_model_gives_the_models_output(grad):
    """torch.func.vmap's wrapped tensors look like plain ones: a patched model's calls
    take the dispatcher under a transform, where vmap runs them per example."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.GELU(), nn.LayerNorm(6)).eval()
    ref = copy.deepcopy(model)
    dt.patch(model)
    x = torch.randn(5, 3, 8)
    with torch.set_grad_enabled(grad):
        got = torch.func.vmap(model)(x)
    torch.testing.assert_close(got, ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("trace", [True, False], ids=["traced", "modules"])
def test_a_pickled_patched_model_loads_as_the_model_before_the_patch(trace):
    """torch.save of the whole patched model (a checkpoint of the model object) stores it
    as it was before the patch: its plan handle means nothing in another process. The copy
    loads, runs its own forwards, scripts, and can be patched again; the patched original
    and a deep copy of it stay patched."""
    import io

    torch.manual_seed(0)
    model = _randomize_bn(SmallResNet()).eval()
    ref = copy.deepcopy(model)
    dt.patch(model, trace=trace)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert not dt.is_patched(loaded) and dt.is_patched(model)
    assert not any(type(m.__dict__.get("forward")).__module__.startswith("dnnctl")
                   for m in loaded.modules())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ref(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
    torch.jit.script(loaded)  # no longer the patched model's refusal
    with pytest.raises(UsageError, match="cannot compile a patched model"):
        torch.jit.script(model)
    twin = copy.deepcopy(model)
    assert dt.is_patched(twin)
    dt.unpatch(twin)
    dt.patch(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ref(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", [nn.ReLU, nn.SiLU, nn.Hardswish])
def test_in_place_activation_trains_module_by_module(act):
    """An inplace=True activation patched module by module (a model fx cannot trace, or
    trace=False) in training: its backward keeps a copy of the input it overwrites, so
    backward runs and equals eager's (it used to refuse: the saved input was modified)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), act(inplace=True),
                        nn.Conv2d(8, 4, 3)).train()
    model = copy.deepcopy(ref)
    dt.patch(model, trace=False)
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(2, 3, 10, 10))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))


class _Checkpointed(nn.Module):
    """Two blocks under activation checkpointing, one in each of torch's modes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Bottleneck(16, 4), Bottleneck(16, 4)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        x = checkpoint(self.a, x, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(self.b, x, use_reentrant=True)


def test_activation_checkpointing_survives_the_patch():
    """torch.utils.checkpoint in a patched model stays checkpointing (one graph node whose
    blocks run patched module by module), not inlined by the trace: gradients equal eager's,
    and each BatchNorm's statistics are updated again by the recomputation, as eager's are."""
    import torch.utils.checkpoint as tuc

    real = tuc.checkpoint
    torch.manual_seed(0)
    ref = _randomize_bn(_Checkpointed()).train()
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert report.traced and tuc.checkpoint is real  # put back after the trace
    targets = [str(n.target) for n in model.forward.gm.graph.nodes if n.op == "call_function"]
    assert sum("checkpoint" in t for t in targets) == 2, targets
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(2, 16, 8, 8))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    assert int(model.b.bn1.num_batches_tracked) == 2  # forward + recomputation


def test_checkpointing_through_a_partial_patches_module_by_module():
    """A checkpoint function bound before the trace (Hugging Face's
    ``functools.partial(checkpoint, use_reentrant=False)``) cannot become a graph node: the
    patch goes module by module, where the model's own forward keeps checkpointing (BN
    statistics updated again by the recomputation, as eager's)."""
    import functools

    import torch.utils.checkpoint as tuc

    class HFStyle(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Bottleneck(16, 4)
            self.ckpt = functools.partial(tuc.checkpoint, use_reentrant=False)

        def forward(self, x):
            return self.ckpt(self.block.__call__, x)

    torch.manual_seed(0)
    ref = _randomize_bn(HFStyle()).train()
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert not report.traced and "checkpoint" in report.trace_error
    assert report.covered  # its modules are still on dnnctl
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(2, 16, 8, 8))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))
    assert int(model.block.bn1.num_batches_tracked) == 2
    assert isinstance(tuc.CheckpointFunction, type)  # the class itself, put back


class _SavesOutputs(nn.Module):
    """Ops whose backward reads tensors saved beside their inputs (batch_norm's batch
    statistics, softmax's output, attention's output and lse), under non-reentrant
    checkpointing."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.softmax, self.log_softmax = nn.Softmax(-1), nn.LogSoftmax(1)

    def block(self, x):
        y = self.softmax(self.bn(self.conv(x))) + self.log_softmax(x.mean(1, keepdim=True))
        q = y.reshape(2, 2, 4, 16)
        return F.scaled_dot_product_attention(q, q, q).flatten(1)

    def forward(self, x):
        import torch.utils.checkpoint as tuc

        return tuc.checkpoint(self.block, x, use_reentrant=False)


@pytest.mark.parametrize("trace", [True, False], ids=["traced", "module-by-module"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_non_reentrant_checkpoint_unpacks_each_saved_tensor_once(trace, dtype):
    """A backward reads ctx.saved_tensors once: non-reentrant checkpointing recomputes the
    saved tensors on the first read and raises on a second (BatchNorm in float64, which
    takes the functional batch_norm_train op, and softmax / attention in any dtype did)."""
    torch.manual_seed(0)
    ref = _randomize_bn(_SavesOutputs()).to(dtype).train()
    model = copy.deepcopy(ref)
    dt.patch(model, trace=trace, backward="dnnctl")
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(2, 3, 4, 4, dtype=dtype))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))


def test_compiled_patched_model_keeps_its_checkpoint_node():
    """torch.compile over a patched model whose graph holds checkpoint nodes (dynamo takes
    them as its checkpoint operator): the same output and input gradient as eager."""
    torch.manual_seed(0)
    ref = _randomize_bn(_Checkpointed()).train()
    model = copy.deepcopy(ref)
    dt.patch(model)
    compiled = torch.compile(model, backend="aot_eager")
    want, got, xa, xb = _forward_backward(ref, compiled, torch.randn(2, 16, 8, 8))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make", [lambda: _randomize_bn(SmallResNet()), ViTBlock],
                         ids=["resnet", "vit"])
def test_compiled_training_with_dnnctls_backward_traces_torchs_formulas(make):
    """backward="dnnctl" under torch.compile: AOT autograd traces the backward with fake
    tensors, which dnnctl's own backward kernels (real data, outside the dispatcher) cannot
    run on ('.numpy() is not supported for tensor subclasses'); the traced backward takes
    torch's formulas, and the eager calls of the same model still take dnnctl's."""
    torch.manual_seed(0)
    ref = make().train()
    model = copy.deepcopy(ref)
    dt.patch(model, backward="dnnctl")
    shape = (2, 3, 16, 16) if isinstance(ref, SmallResNet) else (2, 5, 32)
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(*shape)
    want, got, xa, xb = _forward_backward(ref, compiled, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-3, 1e-4))
    before = sum(n for k, n in dt.BACKWARD_PATHS.items() if k[2] == "dnnctl")
    model.zero_grad()
    model(x.clone().requires_grad_()).sum().backward()
    assert sum(n for k, n in dt.BACKWARD_PATHS.items() if k[2] == "dnnctl") > before


class _ShortcutLast(nn.Module):
    """diffusers' ResnetBlock2D order: the 1x1 shortcut conv runs after conv2, so its output
    is the residual of a chain already fused (the fused node is its user)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.act, self.conv_shortcut = nn.SiLU(), nn.Conv2d(4, 8, 1)

    def forward(self, x):
        h = self.conv2(self.act(self.conv1(x)))
        return self.conv_shortcut(x) + h


def test_a_conv_feeding_a_fused_chains_residual_patches():
    """patch raised KeyError('dnnctl_conv2') in eval: the fusion pass looked up the fused
    chain's new submodule (the shortcut conv's user) in the module table made before it."""
    torch.manual_seed(0)
    model = _ShortcutLast().eval()
    x = torch.randn(2, 4, 5, 5)
    want, got, report = _eager_and_patched(model, x)
    assert report.traced
    assert {f.head: f.parts for f in report.fusions} == {"conv1": ["silu"],
                                                         "conv2": ["residual"]}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _TimeEmbedding(nn.Module):
    """A diffusion ResBlock's time embedding, ``conv(h) + temb[:, :, None, None]``, and the
    same after a BatchNorm before a ReLU: adds that broadcast, not residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.t = nn.Conv2d(4, 8, 3, padding=1), nn.Linear(6, 8)
        self.bn, self.relu = nn.BatchNorm2d(8), nn.ReLU()

    def forward(self, x, temb):
        h = self.conv(x) + self.t(temb)[:, :, None, None]
        return self.relu(self.bn(h) + temb[:, :1, None, None])


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_an_add_that_broadcasts_runs_after_the_fused_op(mode):
    """A conv (or BatchNorm) followed by an add of a tensor that broadcasts was fused as the
    epilogue's residual; the op refused it at run time (the whole conv / batch_norm fell
    back to torch, counted in report.fallbacks()). Now the op runs on dnnctl and torch adds,
    as eager: same outputs, gradients and statistics, no fallback."""
    torch.manual_seed(0)
    ref = getattr(_randomize_bn(_TimeEmbedding()), mode)()
    model = copy.deepcopy(ref)
    x, temb = torch.randn(2, 4, 5, 5), torch.randn(2, 6)
    with dt.patched(model) as report:
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = ref(xa, temb), model(xb, temb)
        g = torch.randn_like(want)
        want.backward(g)
        got.backward(g)
    assert "residual" in {p for f in report.fusions for p in f.parts}
    assert report.fallbacks() == {}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    _assert_same_grads(ref, model, xa, xb, (1e-4, 1e-5), (1e-4, 1e-5))
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=n)


class _MaskedLayer(nn.Module):
    """CLIP's encoder layer signature: ``layer(h, attention_mask, causal_attention_mask)``,
    both masks required and either one may be None."""

    def __init__(self) -> None:
        super().__init__()
        self.qk, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, h, attention_mask, causal_attention_mask):
        scores = self.qk(h) @ h.transpose(-1, -2)
        if attention_mask is not None and causal_attention_mask is not None:
            attention_mask = attention_mask + causal_attention_mask
        elif causal_attention_mask is not None:
            attention_mask = causal_attention_mask
        if attention_mask is not None:
            scores = scores + attention_mask
        return self.norm(scores.softmax(-1) @ h)


def test_a_required_argument_given_none_runs_the_models_forward():
    """The trace gives each required argument a traced value, which ``is not None`` takes
    for a tensor: a call passing None ran the graph and raised TypeError (None + Tensor).
    It runs the model's own forward (its modules still on dnnctl); tensors run the graph."""
    torch.manual_seed(0)
    model = _MaskedLayer().eval()
    h = torch.randn(2, 5, 16)
    causal = torch.full((5, 5), -1e9).triu(1)
    calls = [(h, None, causal), (h, causal, causal), (h, None, None)]
    with torch.no_grad():
        want = [model(*c) for c in calls]
        with dt.patched(model) as report:
            got = [model(*c) for c in calls]
            got.append(model(h, attention_mask=None, causal_attention_mask=causal))
    assert report.traced
    for g, w in zip(got, [*want, want[0]]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


class _Teacher(nn.Module):
    """BYOL / DINO style: a target network under ``torch.no_grad()`` in the forward, and a
    rotary-style block under ``autocast(enabled=False)`` (a decorator), as Hugging Face's
    rotary embeddings are written."""

    def __init__(self) -> None:
        super().__init__()
        self.online, self.target = nn.Linear(8, 8), nn.Linear(8, 8)
        self.rot, self.act = nn.Linear(8, 8), nn.ReLU()

    @torch.autocast("cpu", enabled=False)
    def _fp32(self, x):
        return self.rot(x.float())

    def forward(self, x):
        with torch.no_grad():
            t = self.target(x)  # its ReLU is outside the block: no fusion across it
        return self.act(self.online(x)) - self.act(t) + self._fp32(x)


def test_no_grad_and_autocast_blocks_in_a_forward_survive_the_trace():
    """fx ran ``with torch.no_grad()`` / ``autocast(enabled=False)`` once, at trace time:
    the graph gave the target network gradients (and the input a wrong one), and computed
    the float32 block in bfloat16 under an outer autocast. The traced graph now enters and
    leaves the blocks itself (eager, compiled and exported); a chain does not fuse across."""
    torch.manual_seed(0)
    ref = _Teacher().eval()
    model = copy.deepcopy(ref)
    report = dt.patch(model)
    assert report.traced and [f.head for f in report.fusions] == ["online"]
    want, got, xa, xb = _forward_backward(ref, model, torch.randn(3, 8))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert model.target.weight.grad is None and ref.target.weight.grad is None
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-6)
    for (n, pa), pb in zip(ref.named_parameters(), model.parameters()):
        if pa.grad is not None:
            torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-5, atol=1e-6, msg=n)
    x = torch.randn(3, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = ref(x), model(x)
        assert torch.is_autocast_enabled("cpu") and not torch.is_grad_enabled()
    assert got.dtype == want.dtype == torch.float32 and torch.is_grad_enabled()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    y = compiled(x.requires_grad_())
    y.sum().backward()
    torch._dynamo.reset()
    assert model.target.weight.grad is None
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-6)


class _UltralyticsConv(nn.Module):
    """ultralytics' Conv: its activation is a class attribute, one SiLU that every Conv of
    every model built in the process holds."""

    default_act = nn.SiLU()

    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2)
        self.act = self.default_act

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def test_two_patched_models_may_share_modules():
    """Two models built alike share ultralytics' activation, and two heads may hold one
    backbone: the second patch was refused ("already routed ... patches do not nest").
    It now leaves a shared module as the first patch routes it, says so, and both models
    give eager's results before and after either is unpatched; nesting is still refused."""
    torch.manual_seed(0)
    backbone = nn.Sequential(_UltralyticsConv(3, 8), _UltralyticsConv(8, 8))
    a = nn.Sequential(backbone, nn.Conv2d(8, 2, 1)).eval()
    b = nn.Sequential(backbone, nn.Conv2d(8, 4, 1), _UltralyticsConv(4, 4)).eval()
    _randomize_bn(b)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        want_a, want_b = a(x), b(x)
        dt.patch(a)
        report = dt.patch(b)
        assert {c.name for c in report.covered if "shared" in c.note} == {
            "0.0.conv", "0.0.bn", "0.0.act", "0.1.conv", "0.1.bn"}
        torch.testing.assert_close(a(x), want_a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b(x), want_b, rtol=1e-5, atol=1e-5)
        with pytest.raises(UsageError, match="not patched"):
            dt.unpatch(backbone)  # routed, but by the patches of a and b
        with pytest.raises(UsageError, match="patches do not nest"):
            dt.patch(nn.Sequential(a))
        dt.unpatch(a)
        torch.testing.assert_close(b(x), want_b, rtol=1e-5, atol=1e-5)
        dt.unpatch(b)
        assert not [n for n, m in b.named_modules() if "forward" in m.__dict__]
        torch.testing.assert_close(b(x), want_b, rtol=0, atol=0)


@pytest.mark.parametrize("how", [{}, {"trace": False}, {"graphs": True}],
                         ids=["traced", "modules", "graphs"])
def test_a_pickled_patched_model_loads_without_dnnctl(how):
    """A checkpoint of the whole patched model named dnnctl.torch.patch's own functions
    (each patched forward pickled as ``_as_is(the forward before)``): loading it where
    dnnctl is not installed (a deployment image) failed with ModuleNotFoundError. It names
    only the standard library's, and loads as the model before the patch."""
    import io
    import pickle

    class NoDnnctl(pickle.Unpickler):
        def find_class(self, module, name):
            assert not module.startswith("dnnctl"), f"{module}.{name}"
            return super().find_class(module, name)

    torch.manual_seed(0)
    model = _randomize_bn(SmallResNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = model(x)
    dt.patch(model, **how)
    loaded = NoDnnctl(io.BytesIO(pickle.dumps(model))).load()
    assert not dt.is_patched(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
    torch.jit.script(loaded)
