"""benchmarks/bench_train.py without a GPU: --help, the tiny CPU training run (patched with
dnnctl's backward kernels vs eager, loss check) and the training-workload recording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_train.py"
if not SCRIPT.is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_without_cuda():
    res = _run("--help")
    assert res.returncode == 0, res.stderr
    assert "--record-workload" in res.stdout and "--backward" in res.stdout


def test_tiny_cpu_training_steps(tmp_path):
    out = tmp_path / "train.json"
    res = _run("--device", "cpu", "--tiny", "--steps", "2", "--backward", "dnnctl",
               "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["way"]) for r in rows] == [
        ("resnet50-tiny", "eager"), ("resnet50-tiny", "dnnctl-dnnctl"),
        ("resnet50-tiny", "eager-fp32"), ("vit-2blocks-tiny", "eager"),
        ("vit-2blocks-tiny", "dnnctl-dnnctl"), ("vit-2blocks-tiny", "eager-fp32")]
    for eager, patched, fp32 in (rows[0:3], rows[3:6]):
        # judged against float64: the patched gradients no further off than eager's
        assert patched["check"] == "PASS", patched
        assert 0 < eager["grad_err"] < 0.5 and patched["grad_err"] <= max(
            2 * eager["grad_err"], 1e-3)
        assert patched["loss_rel_diff"] < 0.05 and fp32["loss"] > 0
        assert eager["loss"] > 0 and patched["ms"] > 0
        assert patched["bwd_dnnctl"] > 0 and patched["bwd_torch"] == 0
    assert set(rows[1]["backward_paths"]) >= {"conv2d/dgrad", "conv2d/wgrad",
                                              "batch_norm/backward", "pool2d/backward"}
    assert set(rows[4]["backward_paths"]) >= {"layer_norm/backward", "matmul/wgrad"}
    assert "| resnet50-tiny | dnnctl-dnnctl |" in res.stdout and "PASS" in res.stdout


def test_record_training_workload(tmp_path):
    res = _run("--device", "cpu", "--tiny", "--models", "resnet50", "--record-workload",
               str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    from dnnctl.workloads import read_workload

    wl = read_workload(tmp_path / "resnet50-tiny-train.workload.yaml")
    passes = {(p.op, p.get("pass", "forward")) for p in wl.problems}
    assert {("conv2d", "forward"), ("conv2d", "dgrad"), ("conv2d", "wgrad"),
            ("batch_norm", "backward"), ("pool2d", "backward")} <= passes
    # recorded under CPU autocast: the convolutions run in bfloat16
    assert {p["dtype"] for p in wl.problems if p.op == "conv2d"} == {"bfloat16"}
