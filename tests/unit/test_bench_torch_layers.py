"""benchmarks/bench_torch_layers.py on the CPU: every patched-module layer it times runs
(the stubbed dnnctl.ops call included) and the stub is removed afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_torch_layers.py"
if not SCRIPT.is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)


def test_layers_are_timed_as_json():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, str(SCRIPT), "--calls", "200", "--json"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    labels = [r["layer"] for r in rows]
    assert labels[:3] == ["FusedConv conv+bn+relu, channels-last", "FusedLinear linear+gelu",
                          "patched LayerNorm module"]
    assert all(0 < r["us"] < 10_000 for r in rows)


def test_the_stub_is_removed():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_torch_layers
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from dnnctl.torch import kernels

    before = kernels.call
    bench_torch_layers.rows(50)
    assert kernels.call is before
