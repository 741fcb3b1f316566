"""The Python version against the wheels of the framework release (each torch / TensorFlow
row's python range, from the release's own compatibility table)."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def test_tensorflow_28_has_no_wheel_for_python_313(tmp_path: Path) -> None:
    # tensorflow/tensorflow#85298: 'There was no python [3].13 at the time of tensorflow 2.8'
    got = doctor(tmp_path, "os: Windows 10\npython: '3.13'\nframeworks: {tensorflow: "
                 "{version: '2.8'}}\n")
    [f] = got.of("python-version", "tensorflow")
    assert f["severity"] == "error" and "from versions: none" in f["message"]
    assert f["evidence"] == {"python": "3.13", "supported": ">=3.7, <3.11"}
    assert ">=3.7, <3.11" in f["fix"] and "WSL2" in f["fix"]  # 2.20 is CPU-only on Windows
    assert 'pip install "tensorflow==2.20.*"' in got.text
    # a Python inside the range is not a finding
    ok = doctor(tmp_path, "python: '3.10'\nframeworks: {tensorflow: {version: '2.8'}}\n")
    assert not ok.of("python-version")


def test_torch_release_and_python(tmp_path: Path) -> None:
    gpu = "gpus: [{name: NVIDIA A100-SXM4-80GB}]\ndriver: {version: 570.124.06}\n"
    got = doctor(tmp_path, gpu + "python: '3.12.3'\nframeworks: {torch: {version: "
                 "2.1.2+cu121}}\n")
    [f] = got.of("python-version", "torch")
    assert f["evidence"]["python"] == "3.12" and "download.pytorch.org" in f["fix"]
    assert not doctor(tmp_path, gpu + "python: '3.11'\nframeworks: {torch: {version: "
                      "2.1.2+cu121}}\n").of("python-version")
    # no python given: nothing said
    assert not doctor(tmp_path, gpu + "frameworks: {torch: {version: 2.1.2+cu121}}\n"
                      ).of("python-version")
