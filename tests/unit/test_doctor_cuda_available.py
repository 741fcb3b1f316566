"""torch.cuda.is_available() False in a snapshot is never a pass: the first cause the snapshot
supports (a driver older than the build's CUDA, CUDA_VISIBLE_DEVICES hiding the GPUs, a
CPU-only build), else a warning saying what to check."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

GPU = 'gpus: [{name: "NVIDIA GeForce RTX 3090"}]\n'


def test_a_driver_older_than_the_builds_cuda_is_an_error_with_a_build_it_runs(
        tmp_path: Path) -> None:
    # a release line the matrix lacks: only its +cu124 tag says which CUDA it needs
    d = doctor(tmp_path, GPU + 'driver: {version: "470.57.02"}\n'
               'frameworks: {torch: {version: "3.9.0+cu124", cuda_available: false}}\n')
    [f] = d.of("driver-too-old", "torch")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "is_available() is False" in f["message"]
    assert "install NVIDIA driver >= 550.54.14" in f["fix"]
    assert "`pip install 'torch==2.7.*' --index-url https://download.pytorch.org/whl/cu118`" \
        in f["fix"]
    assert not d.of("cuda-unavailable")


@pytest.mark.parametrize("torch", ['version: "2.4.0+cu124"',
                                   'version: "2.4.0a0+git1234", cuda: "12.4"'])
def test_a_build_already_judged_keeps_its_own_driver_finding(tmp_path: Path, torch: str) -> None:
    d = doctor(tmp_path, GPU + 'driver: {version: "450.80.02"}\n'
               f'frameworks: {{torch: {{{torch}, cuda_available: false}}}}\n')
    [f] = d.of("driver-too-old", "torch")
    assert "is_available" not in f["message"] and not d.of("cuda-unavailable")
    assert d.data["verdict"] == "fail"


def test_build_cuda_unknown_and_the_driver_cuda_known_names_the_next_releases_driver(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, 'driver: {cuda: "8.0"}\n'
               'frameworks: {torch: {installer: "source build", cuda_available: false}}\n')
    [f] = d.of("driver-too-old", "torch")
    assert f["severity"] == "warning" and d.data["verdict"] == "warn"
    assert "supports CUDA 8.0 at most" in f["message"]
    assert "CUDA 9.0: install NVIDIA driver >= 384.81" in f["fix"]
    assert "python -c 'import torch; print(torch.version.cuda)'" in f["fix"]
    assert "rebuild torch with CUDA_HOME set to a CUDA <= 8.0 toolkit" in f["fix"]


@pytest.mark.parametrize("visible", ["", "-1"])
def test_cuda_visible_devices_hiding_every_gpu(tmp_path: Path, visible: str) -> None:
    d = doctor(tmp_path, GPU + 'driver: {version: "550.54.14"}\n'
               f'environment: {{CUDA_VISIBLE_DEVICES: "{visible}"}}\n'
               'frameworks: {torch: {version: "2.4.0+cu121", cuda_available: false}}\n')
    [f] = d.of("no-gpu", "torch")
    assert f["severity"] == "warning" and "unset CUDA_VISIBLE_DEVICES" in f["fix"]
    assert not d.of("cuda-unavailable")


def test_a_cpu_build_checked_for_cuda_warns(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'frameworks: {torch: {version: "2.2.0+cpu", cuda_available: false}}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "warning" and "CPU-only" in f["message"]
    assert not d.of("cuda-unavailable")


def test_no_cause_in_the_snapshot_is_still_a_warning(tmp_path: Path) -> None:
    d = doctor(tmp_path, GPU + 'driver: {version: "550.54.14"}\n'
               'frameworks: {torch: {version: "2.4.0+cu121", cuda_available: false}}\n')
    [f] = d.of("cuda-unavailable", "torch")
    assert f["severity"] == "warning" and d.data["verdict"] == "warn"
    assert "nvidia-smi" in f["fix"] and "torch.version.cuda" in f["fix"]


def test_cuda_available_true_adds_nothing(tmp_path: Path) -> None:
    d = doctor(tmp_path, GPU + 'driver: {version: "550.54.14"}\n'
               'frameworks: {torch: {version: "2.4.0+cu121", cuda_available: true}}\n')
    assert d.data["verdict"] == "pass" and not d.of("cuda-unavailable")
