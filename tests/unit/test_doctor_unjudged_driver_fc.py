"""A driver known only by the CUDA it reports is `?`, never ✓; cuda-compat in use with no GPU
named makes a too-old driver conditional (a warning), never a certain error."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def test_driver_with_only_its_cuda_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, cuda: '12.1'}\n"
               "cuda_runtimes: [{version: '11.7', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n")
    [f] = d.of("not-judged", "driver")
    assert "reports CUDA 12.1" in f["message"] and "driver_version" in f["fix"]
    assert "✓ driver" not in d.text and "? driver" in d.text


def test_a_versioned_driver_keeps_its_ok(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '535.54.03', cuda: '12.2'}\n")
    assert not d.of("not-judged", "driver") and d.of("ok", "driver")


FC = ("driver: {present: true, version: '470.199.02', cuda: '12.2', forward_compat: true}\n"
      "cuda_runtimes: [{version: '12.2', source: pip:nvidia-cuda-runtime-cu12}]\n")


def test_forward_compat_with_no_gpu_named_is_conditional(tmp_path: Path) -> None:
    d = doctor(tmp_path, FC)
    [f] = d.of("driver-too-old", "cuda")
    assert f["severity"] == "warning" and d.data["verdict"] != "fail"
    assert "cuda-compat 12.2" in f["message"] and "names no GPU" in f["message"]
    assert "nvidia-smi -L" in f["fix"] and "535.54.03" in f["fix"]


def test_forward_compat_on_a_consumer_gpu_stays_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, FC + "gpus: [{name: NVIDIA GeForce RTX 3090}]\n")
    assert any(f["severity"] == "error" for f in d.of("driver-too-old", "cuda"))
