"""RAPIDS' GPU floor (matrix table gpu_minimums): compute capability 6.0 for every release,
7.0 from 24.02, 7.5 for the CUDA 13 builds; -cu11 / -cu12 wheel names count."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

MAXWELL = "gpus: [{compute_capability: '5.0'}]\n"
PASCAL = "gpus: [{name: NVIDIA GeForce GTX 1080}]\n"


def test_maxwell_fails_every_rapids_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, MAXWELL + "packages: {cuml: null, cudf: null}\n")
    for name in ("cuml", "cudf"):
        [f] = d.of("arch-unsupported", name)
        assert f["severity"] == "error" and "compute capability 6.0 or newer" in f["message"]
        assert "7.0 for RAPIDS 24.02" in f["fix"] and "scikit-learn" in f["fix"]
        assert "NVIDIA/cuml#5484" in f["source"]
        assert not d.of("not-judged", name)  # the 24.02 floor adds nothing to this error


def test_pascal_with_a_release_before_24_02_passes_the_floor(tmp_path: Path) -> None:
    d = doctor(tmp_path, PASCAL + "packages: {cudf-cu12: '23.12.1'}\n")
    assert not d.of("arch-unsupported")


def test_pascal_with_24_02_or_later_fails_with_the_last_pascal_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, PASCAL + "packages: {cuml-cu12: '24.04.00'}\n")
    [f] = d.of("arch-unsupported", "cuml-cu12")
    assert "7.0 or newer" in f["message"] and "UnsupportedCUDAError" in f["message"]
    assert "rapids=23.12" in f["fix"] and "rsn0034" in f["source"]


def test_pascal_with_release_unknown_names_the_24_02_floor(tmp_path: Path) -> None:
    d = doctor(tmp_path, PASCAL + "packages: {cugraph-cu11: null}\n")
    assert not d.of("arch-unsupported")
    [f] = d.of("not-judged", "cugraph-cu11")
    assert ">=24.02" in f["message"] and "7.0" in f["message"]
    assert "pip show cugraph-cu11" in f["fix"]


def test_cuda13_builds_start_at_turing(tmp_path: Path) -> None:
    volta = "gpus: [{name: Tesla V100-SXM2-16GB}]\n"
    [f] = doctor(tmp_path, volta + "packages: {cudf-cu13: '25.12.0'}\n").of(
        "arch-unsupported", "cudf-cu13")
    assert "7.5 or newer" in f["message"] and "-cu12 wheels" in f["fix"]
    assert not doctor(tmp_path, volta + "packages: {cudf-cu12: '25.12.0'}\n").of(
        "arch-unsupported")


def test_no_gpu_known_judges_no_floor(tmp_path: Path) -> None:
    d = doctor(tmp_path, "packages: {cudf: '23.06.00'}\n")
    assert not d.of("arch-unsupported")
