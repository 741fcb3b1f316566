"""benchmarks/bench_train_host_cpu.py and its stub GPU (benchmarks/stub_gpu.py) on the CPU:
a patched training step takes the routes a GPU run takes (convolutions as torch's own calls, the fused BatchNorms' backward on dnnctl), every part is timed, and the
stub is removed afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_train_host_cpu.py"
if not SCRIPT.is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)


def test_the_stub_step_takes_the_gpu_routes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "found.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--parts", "ops,step,floor,paths,profile",
                          "--reps", "1", "--iters", "3",
                          "--depth", "2", "--step-iters", "1", "--profile-steps", "1",
                          "--top", "5", "--json", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    found = json.loads(out.read_text())
    assert [r["op"] for r in found["ops"]] == ["conv3x3", "bn+relu", "bn+add+relu", "bn"]
    assert [r["way"] for r in found["step"]] == ["eager", "patched"]
    assert all(r["step_ms"] > 0 for r in found["step"])
    paths = found["paths"]
    # (the small model's 10-class linear is one the default gives dnnctl's own GEMM)
    assert paths["vendor_via_torch"]["conv2d"] == 53
    assert paths["fallbacks"] == {}
    # 49 BatchNorms end in a ReLU (fused, dnnctl's backward); the 4 downsample ones do not
    assert paths["backward"]["batch_norm/backward"] == {"dnnctl": 49, "torch": 4}
    assert paths["backward"]["conv2d/dgrad"] == {"dnnctl": 0, "torch": 52}
    assert len(found["profile"]) == 5
    assert [r["way"] for r in found["floor"]] == ["eager", "patched", "floor"]


def test_the_stub_is_removed():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import stub_gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from dnnctl.backends import cuda
    from dnnctl.backends.registry import _BACKENDS
    from dnnctl.ops import adapters

    before = (_BACKENDS.get("cupy"), adapters._kind, cuda.Launch.__call__, cuda._NATIVE)
    x = torch.ones(2)
    with stub_gpu.installed():
        assert x.is_cuda and not x.is_cpu
        assert adapters._kind(x) == ("torch-cuda", 0)
    assert not x.is_cuda and x.is_cpu
    assert (_BACKENDS.get("cupy"), adapters._kind, cuda.Launch.__call__, cuda._NATIVE) == before
