"""benchmarks/bench_conv_backward.py without a GPU: the rows (ResNet-50 v1.5 layers + the
ViT-B/16 patch embedding, dgrad and wgrad, fp16 NHWC / fp32 NCHW), the candidate lists on
an H200 description (each valid, the default heuristic's pick always included, split-K for
wgrad), and the compile-job recording."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.registry import get_op

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "benchmarks" / "bench_conv_backward.py").is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_conv_backward as bb  # noqa: E402

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)


def test_rows():
    rows = bb.plan_rows(False, True)
    assert len(rows) == 24 * 2 * 2  # 23 ResNet-50 layers + ViT patch, 2 passes, 2 configs
    vit = [r for r in rows if r.layer.startswith("vit")]
    assert {r.key()["bias"] for r in vit if r.which == "wgrad"} == {True}
    assert {r.key()["bias"] for r in rows if not r.layer.startswith("vit")} == {False}
    p = OP.problem(vit[0].key())
    assert (p["k"], p["r"], p["stride"], p["pass"]) == (768, 16, (16, 16), "dgrad")
    assert len(bb.plan_rows(True, True)) == len(bb.QUICK_LAYERS) * 4


@pytest.mark.parametrize("layer", ["s1 3x3 64->64 @56", "s2 3x3 128->128 @56/2",
                                   "s3 1x1b 256->1024 @14", "vit-b/16 patch 16x16/16",
                                   "conv1 7x7/2"])
def test_candidates_are_valid_and_include_the_default(layer):
    for row in bb.plan_rows(False, True):
        if row.layer != layer:
            continue
        problem = OP.problem(row.key())
        cands = bb.candidates(problem, H200)
        names = {v.name for v, _ in cands}
        assert all(n.startswith(row.which) for n in names), names
        choice = OP.default_choice(problem, "cupy", H200)
        assert any(v.name == choice.variant and p == choice.param_dict for v, p in cands)
        for v, p in cands:
            assert v.supports(problem, H200) and v.check_params(p) is None
            assert v.valid_params(problem, p, H200), (v.name, p)
        if row.which == "wgrad" and row.dtype == "float16" and layer.startswith("s1 3x3"):
            gemm = [p for v, p in cands if v.name == "wgrad_implicit_gemm"]
            assert max(p["splitk"] for p in gemm) >= 16  # N*P*Q split to fill the GPU
        if row.which == "dgrad" and row.dtype == "float16" and "3x3" in layer:
            assert "dgrad_implicit_gemm" in names


def test_compile_jobs_are_recorded():
    rows = [r for r in bb.plan_rows(True, True) if r.layer == "s4 3x3 512->512 @7"][:2]
    jobs = bb.record_jobs(rows, H200)
    sources = {j[0] for j in jobs}
    assert "conv2d/implicit_gemm.cu" in sources and "conv2d/dgrad_phase.cu" in sources
