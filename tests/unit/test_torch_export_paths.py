"""A patched model through the ways models leave Python: torch.export (training mode,
dynamic shapes), torch.onnx.export (standard operators, the model's numbers) and
torch.jit.script of a part of it (a clear error), each against the unpatched model."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

from _torch_models import LlamaBlock, SmallResNet, ViTBlock, bn_stats  # noqa: E402
from torch import nn  # noqa: E402

from dnnctl.errors import UsageError  # noqa: E402


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return bn_stats(SmallResNet())


def _dnnctl_ops(ep: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes
            if n.op == "call_function" and "dnnctl" in str(n.target)]


def test_a_saved_export_of_a_training_resnet_loads_and_trains_as_eagers(tmp_path):
    """torch.export.load of a saved export of a patched ResNet in training mode failed its
    verifier ("Node.meta wrap_with_set_grad_enabled is missing val field": the running
    statistics were copied back under torch.no_grad, a subgraph in the export); the loaded
    module now matches the export of the model unpatched, BatchNorm statistics included."""
    ref = _resnet().train()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(model, (x,))
    assert _dnnctl_ops(ep)
    torch.export.save(ep, str(tmp_path / "model.pt2"))
    got = torch.export.load(str(tmp_path / "model.pt2")).module()
    want = torch.export.export(copy.deepcopy(ref), (x,)).module()
    with torch.no_grad():
        torch.testing.assert_close(got(x), want(x))
    for (n, b_want), (_, b_got) in zip(want.named_buffers(), got.named_buffers()):
        torch.testing.assert_close(b_got, b_want, msg=n)


@pytest.mark.parametrize("by_name", [False, True])
def test_export_with_dynamic_shapes_binds_to_the_models_own_parameters(by_name):
    """dynamic_shapes given as a tuple (one entry per forward parameter) or by parameter
    name: a patched model's forward took ``*args, **kwargs``, so torch.export refused both
    ("inputs[0] is a tuple", "keys must be the arg names ['args']")."""
    ref = _resnet().eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    batch = torch.export.Dim("batch", min=1, max=16)
    shapes = {"x": {0: batch}} if by_name else ({0: batch},)
    ep = torch.export.export(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=shapes)
    x = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), ref(x))


MODELS = {
    "resnet": (_resnet, (2, 3, 16, 16)),
    "vit": (ViTBlock, (2, 5, 32)),
    "llama": (LlamaBlock, (2, 6, 32)),
}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_export_writes_the_models_standard_operators(name, mode, tmp_path):
    """torch.onnx.export of a patched model failed ("unrecognized namespace
    dnnctl::conv2d"): no ONNX runtime has dnnctl's operators. The export now records each
    op's meaning in torch's own operators: a standard ONNX graph computing what the model
    computes (run here by onnx's reference evaluator), the model still patched after."""
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    make, shape = MODELS[name]
    torch.manual_seed(0)
    ref = make().train(mode == "train")
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(shape)
    before = dict(dt.FALLBACKS)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False)
    proto = onnx.load(str(path))
    assert {n.domain for n in proto.graph.node} <= {"", "ai.onnx"}
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = ref.eval()(x)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-5)
    assert dt.is_patched(model) and model.training == (mode == "train")
    assert dict(dt.FALLBACKS) == before  # the export's torch forms are not fallbacks
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), want)


def test_the_dynamo_onnx_exporters_capture_holds_no_dnnctl_op(monkeypatch):
    """torch.onnx.export(dynamo=True) captures the model with torch.export while its
    exporting flag is set: the captured graph has torch's operators only (the ONNX
    translation of a dnnctl op would fail), computing the model's numbers."""
    flags = pytest.importorskip("torch.onnx._internal.exporter._flags")
    ref = _resnet().eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    assert _dnnctl_ops(torch.export.export(model, (x,)))  # outside an ONNX export: kept
    monkeypatch.setattr(flags, "_is_onnx_exporting", True)
    ep = torch.export.export(model, (x,))
    monkeypatch.setattr(flags, "_is_onnx_exporting", False)
    assert not _dnnctl_ops(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), ref(x))


def test_scripting_a_part_of_a_patched_model_names_it():
    """torch.jit.script(model.block1) of a patched model failed deep inside TorchScript
    (AttributeError: '_PatchForward' object has no attribute '__globals__'); now dnnctl's
    error names the patched module and the fix, and after unpatch the part scripts."""
    model = _resnet().eval()
    dt.patch(model)
    with pytest.raises(UsageError, match=r"module 'block1\.conv1' \(Conv2d\) of a patched"):
        torch.jit.script(model.block1)
    with pytest.raises(UsageError, match="cannot compile a patched model"):
        torch.jit.script(model)
    dt.unpatch(model)
    assert not any("__prepare_scriptable__" in m.__dict__ for m in model.modules())
    scripted = torch.jit.script(model.block1)
    x = torch.randn(1, 16, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model.block1(x))


def test_jit_trace_right_after_patch_passes_its_own_check():
    """torch.jit.trace runs the model twice and compares the graphs: the first call after
    patch must read the kept conv + BN fold as the second does (folding then, the two
    runs' graphs differed: "Tracing failed sanity checks")."""
    ref = _resnet().eval()
    model = copy.deepcopy(ref)
    dt.patch(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        traced = torch.jit.trace(model, (x,))
        torch.testing.assert_close(traced(x), ref(x))
