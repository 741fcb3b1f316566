"""Pointwise fusion's generated CUDA kernels (dnnctl.torch.pointwise) against the ops they
replace, run by torch on the same GPU: every case of tests/unit/_pointwise_cases.py in
float32 / float16 / bfloat16, with eager's output layout; inside CUDA-graph capture and on
a side stream; and the patched LLaMA / ViT blocks end to end.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_pointwise_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _pointwise_cases import CASES, inputs  # noqa: E402
from _torch_models import LlamaBlock, ViTBlock  # noqa: E402
from torch import fx  # noqa: E402

import dnnctl.torch as dt  # noqa: E402
from dnnctl.torch import pointwise as pw  # noqa: E402

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# transcendental functions (expf, tanhf, erff, rsqrtf) may differ from torch's by an ulp
# of float32, which a float16 / bfloat16 rounding can turn into one ulp of the output
ULP = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _fused(module):
    gm = fx.symbolic_trace(module)
    lines = pw.fuse_pointwise(gm)
    return gm, lines


def _poison(monkeypatch):
    """Outputs of the kernel start as NaN: an element it does not write shows."""
    real = torch.empty_strided

    def empty_strided(*args, **kwargs):
        return real(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(pw.torch, "empty_strided", empty_strided)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_eager(case, dtype, monkeypatch):
    name, module, shapes, perm = case
    module = module.to("cuda")
    gm, lines = _fused(module)
    assert lines, name
    for seed in range(3):
        args = inputs(shapes, perm, dtype, "cuda", seed)
        with torch.no_grad():
            want = module(*args)
            _poison(monkeypatch)
            got = gm(*args)
            monkeypatch.undo()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            assert not g.isnan().any()
            torch.testing.assert_close(g.float(), w.float(), rtol=ULP[w.dtype],
                                       atol=ULP[w.dtype])
    fused = [m for m in gm.modules() if isinstance(m, pw.FusedPointwise)]
    # the first call of a signature checks the kernel against the ops (and returns the
    # ops' result); the later ones are the kernel's own
    assert all(m.kernel_launches == 3 and not m.refused for m in fused), \
        [(m.kernel_launches, m.refused) for m in fused]


def test_side_stream_and_graph_capture():
    _name, module, shapes, perm = CASES[1]  # the prefill rotary, transposed q
    gm, _ = _fused(module.cuda())
    args = inputs(shapes, perm, torch.bfloat16, "cuda")
    with torch.no_grad():
        want = gm(*args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = gm(*args)
        torch.cuda.current_stream().wait_stream(side)
        for w, g in zip(want, got):
            assert torch.equal(w, g)
        graph = torch.cuda.CUDAGraph()
        static = [a.clone() for a in args]
        static[0] = args[0].clone().transpose(1, 2).contiguous().transpose(1, 2)  # its layout
        gm(*static)
        with torch.cuda.graph(graph):
            out = gm(*static)
        fresh = inputs(shapes, perm, torch.bfloat16, "cuda", seed=5)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        want = gm(*fresh)
        for w, g in zip(want, out):
            assert torch.equal(w, g)


@pytest.mark.parametrize("block", ["llama", "vit"])
def test_patched_blocks(block):
    torch.manual_seed(0)
    if block == "llama":
        model = LlamaBlock().eval().to("cuda", torch.bfloat16)
        x = torch.randn(2, 8, 32, device="cuda", dtype=torch.bfloat16)
    else:
        model = ViTBlock().eval().to("cuda", torch.float16)
        x = torch.randn(2, 10, 32, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = model(x)
        report = dt.patch(model)
        got = model(x)
        got2 = model(x)
    assert torch.equal(got, got2)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    if block == "llama":
        assert report.pointwise
        fused = [m for m in model.forward.gm.modules() if isinstance(m, pw.FusedPointwise)]
        assert fused and all(m.kernel_launches == 2 and not m.refused for m in fused)
