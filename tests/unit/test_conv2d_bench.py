"""benchmarks/bench_conv.py and conv_candidates.py without a GPU: the rows (ResNet-50 v1.5 /
MobileNetV2 layers, priority order), the per-variant candidate lists on an H200 description,
and the compile-job recording (which must not leave its stand-in backend installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend
from dnnctl.ops.registry import get_op

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "benchmarks" / "bench_conv.py").is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_conv  # noqa: E402
import conv_candidates as cc  # noqa: E402

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)


def _row(layer: str, batch: int, dtype: str = "float16", layout: str = "NHWC"):
    return next(r for r in bench_conv.plan_rows(False, True) if r.layer == layer
                and r.batch == batch and r.dtype == dtype and r.layout == layout)


def test_layers_and_row_order():
    rn, mb = bench_conv.resnet50_layers(), bench_conv.mobilenet_v2_depthwise()
    assert len(rn) == 23 and len(mb) == 10
    assert len({tuple(sorted(s.items())) for _, s in rn}) == 23  # distinct shapes
    rows = bench_conv.plan_rows(False, True)
    assert len(rows) == 33 * 3 * 2
    order = [(r.batch, r.dtype) for r in rows]
    firsts = list(dict.fromkeys(order))
    assert firsts == [(32, "float16"), (32, "float32"), (1, "float16"), (1, "float32"),
                      (256, "float16"), (256, "float32")]
    quick = bench_conv.plan_rows(True, True)
    assert len(quick) == 14 and {r.batch for r in quick} == {32}
    key = _row("s4 3x3 512->512 @7", 1, "float32", "NCHW").key()
    assert key["tf32"] and key["bias"] and key["n"] == 1 and key["pad"] == 1


def test_candidates_cover_defaults_split_k_and_skip_hopeless():
    p = OP.problem(_row("s4 3x3 512->512 @7", 1).key())
    cands = cc.candidates(p, H200)
    names = [v.name for v, _ in cands]
    choice = OP.default_choice(p, "cupy", H200)
    assert any(v.name == choice.variant and prm == choice.param_dict for v, prm in cands)
    ig = [prm for v, prm in cands if v.name == "implicit_gemm"]
    assert 4 <= len(ig) <= 1 + cc.TC_KEEP + 8
    assert any(prm["splitk"] > 1 for prm in ig)  # 49 pixels: the tile grid needs split-K
    assert len({tuple(sorted(prm.items())) for prm in ig}) == len(ig)
    assert "winograd" in names and "fft" not in names  # fft only for 5x5 and up
    big = OP.problem(_row("s1 3x3 64->64 @56", 256).key())
    big_names = {v.name for v, _ in cc.candidates(big, H200)}
    assert "direct" not in big_names and "implicit_gemm" in big_names
    conv1 = OP.problem(_row("conv1 7x7/2", 1, "float32", "NCHW").key())
    c1 = {v.name for v, _ in cc.candidates(conv1, H200)}
    assert {"fft", "nhwc_implicit_gemm", "direct"} <= c1
    dw = OP.problem(_row("mbv2 dw 576 @14", 32, "float32", "NCHW").key())
    dwc = cc.candidates(dw, H200)
    assert {v.name for v, _ in dwc} >= {"depthwise", "depthwise_planes"}
    for v, prm in dwc:
        assert v.check_params(prm) is None and v.valid_params(dw, prm, H200)


def test_tc_score_prefers_full_waves_and_split_k_on_few_tiles():
    base = dict(bm=128, bn=128, bk=32, warps=4, stages=4, splitk=1)
    # 49 x 512 x 4608: 4 tiles of 128x128 leave 128 SMs idle; 16 x 64 tiles with split-K fill
    few = cc.tc_score(base, 49, 512, 4608, 1, 132, 2)
    split = cc.tc_score(dict(base, bm=16, bn=64, bk=64, splitk=8), 49, 512, 4608, 1, 132, 2)
    assert split > 2 * few
    big = cc.tc_score(base, 100352, 64, 576, 1, 132, 2)  # bn=128 on K=64: half padding
    narrow = cc.tc_score(dict(base, bn=64), 100352, 64, 576, 1, 132, 2)
    assert narrow > big


def test_labels():
    assert cc.label("implicit_gemm", dict(bm=64, bn=32, bk=64, warps=4, stages=3,
                                          splitk=4)) == "implicit_gemm(64x32x64 w4 s3 sk4)"
    assert cc.label("gemm_1x1", dict(bm=64, bn=32, bk=64, warps=4, stages=3, splitk=1,
                                     pipe="overlap")) == "gemm_1x1(64x32x64 w4 s3 pipe=overlap)"
    assert cc.label("winograd", dict(tile=2, chunk=0)) == "winograd(chunk=0 tile=2)"
    assert cc.label("cublas", {}) == "cublas"


def test_record_jobs_lists_modules_and_restores_the_backend():
    before = get_backend("numpy")
    rows = [_row("s1 3x3 64->64 @56", 32), _row("s2 proj 256->512 @56/2", 1, "float32", "NCHW"),
            _row("mbv2 dw 576 @14", 32, "float32", "NCHW")]
    jobs = bench_conv.record_jobs(rows, H200)
    sources = {j[0] for j in jobs}
    assert {"conv2d/implicit_gemm.cu", "conv2d/transpose.cu", "conv2d/depthwise_planes.cu",
            "conv2d/gemm_1x1.cu", "conv2d/winograd.cu"} <= sources
    assert len(jobs) == len(set(jobs)) >= 20
    from dnnctl.backends import registry as base
    from dnnctl.ops.conv2d import _cuda
    from dnnctl.ops.precompile import CompileRecorder

    assert not isinstance(base._BACKENDS.get("cupy"), CompileRecorder)
    assert not _cuda._OVERRIDE and get_backend("numpy") is before


def test_default_heuristic_on_every_benchmark_row():
    """The un-tuned path picks a supported variant with valid parameters on all 198 rows:
    tensor cores for every non-depthwise layer (fp16, and fp32 with TF32): our kernels, or
    cuBLAS behind im2col / Winograd F(2x2) (F(4x4) runs an exact fp32 GEMM), except that
    CUDA-core direct convolution may win a launch-bound layer of under 0.1 GFLOP."""
    for row in bench_conv.plan_rows(False, True):
        p = OP.problem(row.key())
        choice = OP.default_choice(p, "cupy", H200)
        v = next(v for v, _ in cc.candidates(p, H200) if v.name == choice.variant)
        assert v.supports(p, H200) and v.valid_params(p, choice.param_dict, H200), row
        if "groups" in dict(row.shape):
            assert choice.variant in ("depthwise", "depthwise_planes"), row
        else:
            if choice.variant == "direct":
                assert OP.flops(p) < 1e8, row
                continue
            assert choice.variant in ("implicit_gemm", "implicit_gemm_wgmma", "gemm_1x1",
                                      "nhwc_implicit_gemm", "im2col_gemm", "winograd"), row
            if choice.variant == "winograd":
                assert choice.param_dict["tile"] == 2, row
