"""A driver known only by the CUDA it supports, older than a toolkit that JIT users (numba,
CuPy, NVRTC) compile PTX with: the warning says why and its fix names the driver minimum."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

SNAP = """
os: Ubuntu 22.04
driver: {cuda: "%s"}
cuda_runtimes:
  - {version: "12.1", source: "system:/usr/local/cuda-12.1"}
packages: {numba: "0.57.0"}
"""


def test_toolkit_newer_than_the_driver_names_the_driver_minimum(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % "12.0")
    [f] = d.of("driver-mvc")
    assert f["severity"] == "warning" and "cudaErrorUnsupportedPtxVersion" in f["message"]
    assert f["fix"].startswith("install NVIDIA driver >= 530.30.02")
    assert f["evidence"]["required"] == "530.30.02"
    assert "cuda.yaml" in f["source"]


def test_driver_of_the_toolkits_release_is_no_finding(tmp_path: Path) -> None:
    assert not doctor(tmp_path, SNAP % "12.1").of("driver-mvc")
