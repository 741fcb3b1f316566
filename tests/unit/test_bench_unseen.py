"""benchmarks/bench_unseen.py without a GPU: the problem list is valid for the ops' schemas,
a registered CUDA variant supports every problem on an H200, the quick tune's candidates are
the default plus distinct cost-model picks, none of the shapes is a bundled workload's, and
the script starts (--help) without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dnnctl.ops  # noqa: F401 - registers the ops
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.explain import ranked_estimates
from dnnctl.ops.registry import get_op, variants

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_unseen  # noqa: E402
import unseen_cases  # noqa: E402

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)


def test_every_problem_is_valid_and_supported():
    todo = unseen_cases.cases()
    assert len(todo) == 2 * len(unseen_cases.CONVS) + len(unseen_cases.GEMMS)
    assert len({(c.name, c.config) for c in todo}) == len(todo)
    for case in todo:
        problem = get_op(case.op).problem(case.key_dict)  # raises on a bad key
        supported = [v.name for v in variants(case.op, "cupy") if v.supports(problem, H200)]
        assert supported, case
        assert ranked_estimates(problem, "cupy", H200), case


def test_both_conv_configs_and_the_promised_models():
    convs = unseen_cases.conv_cases()
    assert {c.config for c in convs} == {"float16 NHWC", "float32 NCHW"}
    assert all(dict(c.key)["tf32"] for c in convs if c.config == "float32 NCHW")
    sources = {c.source for c in unseen_cases.cases()}
    assert {"SD v1.5 UNet", "EfficientNet-B0", "ConvNeXt-T", "YOLOv8-s", "Whisper",
            "DeepLabv3", "LLaMA-2-7B", "Mistral-7B", "Mixtral-8x7B", "BERT-large"} <= sources
    whisper = next(c for c in convs if c.name.startswith("whisper conv2")
                   and c.config == "float32 NCHW")
    k = whisper.key_dict
    assert (k["h"], k["r"], k["s"], k["stride"], k["pad"]) == (1, 1, 3, [1, 2], [0, 1])
    p = get_op("conv2d").problem(k)
    assert get_op("conv2d").output_specs(p)["y"].shape == (8, 768, 1, 1500)
    gemms = {c.name: c.key_dict for c in unseen_cases.gemm_cases()}
    assert any(k["m"] == 1 for k in gemms.values())  # a decode GEMV
    assert any(k["batch"] == 8 for k in gemms.values())  # the Mixtral experts
    gelu = [k for k in gemms.values() if k["activation"] == "gelu"]
    assert gelu and all(k["bias"] for k in gelu)


def test_quick_is_a_subset_and_not_the_bundled_layers():
    full = {(c.name, c.config) for c in unseen_cases.cases()}
    quick = unseen_cases.cases(quick=True)
    assert 0 < len(quick) < len(full) and {(c.name, c.config) for c in quick} <= full
    assert {c.op for c in quick} == {"conv2d", "matmul"}
    assert [c.op for c in unseen_cases.cases(only="gemm")] == ["matmul"] * len(
        unseen_cases.GEMMS)
    import bench_conv

    bundled = {(d["c"], d["h"], d["k"], d["r"], d["stride"])
               for _, d in bench_conv.resnet50_layers() + bench_conv.mobilenet_v2_depthwise()}
    for c in unseen_cases.conv_cases():
        k = c.key_dict
        assert (k["c"], k["h"], k["k"], k["r"], k["stride"][0]) not in bundled, c.name


def test_quick_tune_candidates_start_with_the_default():
    for case in unseen_cases.cases(quick=True):
        problem = get_op(case.op).problem(case.key_dict)
        cands = bench_unseen.candidates(problem, H200, 4)
        default = get_op(case.op).default_choice(problem, "cupy", H200)
        assert cands[0] == (default.variant, default.param_dict)
        assert 1 <= len(cands) <= 5 + 2 * bench_unseen.DEPTHWISE_EXTRA
        assert len({(n, tuple(sorted(p.items()))) for n, p in cands}) == len(cands)


def test_help_runs_without_cuda():
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_unseen.py"),
                          "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--out" in out.stdout and "--top-k" in out.stdout


def test_summary_reports_the_goals():
    rows = [
        {"config": "float16 NHWC", "shape": "a", "default_ratio": 0.8, "tuned_ratio": 1.2,
         "default_vs_tuned": 0.95},
        {"config": "float32 NCHW", "shape": "b", "default_ratio": 0.5, "tuned_ratio": 0.85,
         "default_vs_tuned": 0.5},
        {"config": "bfloat16", "shape": "square 8192^3", "default_ratio": 1.0,
         "tuned_ratio": 1.0, "default_vs_tuned": 1.0, "tuned": "cublas"},
    ]
    text = bench_unseen.summary(rows)
    assert "within 10% of the tuned choice: 2/3" in text
    assert "min 0.85" in text and "square 8192^3: tuned 1.00x torch (cublas)" in text
