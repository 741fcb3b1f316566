"""driver.gpu_count below the GPUs the snapshot names: some GPU is not driven (the open kernel
modules leave pre-Turing GPUs out; vfio / nouveau / unsupported / fallen off the bus)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

TWO = ("gpus:\n  - {name: NVIDIA GeForce RTX 2060, compute_capability: '7.5'}\n"
       "  - {name: NVIDIA GeForce GTX 1070 Ti, compute_capability: '6.1'}\n")


def test_a_pascal_gpu_missing_beside_a_turing_one_names_the_open_modules(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Ubuntu 20.04\ndriver: {present: true, version: '560.35.03', "
               "cuda: '12.6', gpu_count: 1}\n" + TWO)
    [f] = d.of("gpu-not-driven", "gpu")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "1 of the 2 GPUs" in f["message"] and "GTX 1070 Ti (cc 6.1)" in f["message"]
    assert "open kernel modules" in f["message"] and "GSP" in f["message"]
    assert "proprietary kernel-module flavour" in f["fix"] and "-m=kernel" in f["fix"]
    assert "nvidia-smi -L" in f["fix"] and "lspci -nnk" in f["fix"] and "nvrm" in f["fix"]
    assert "kernel_open.html" in f["source"] and "compat/gpus.yaml" in f["source"]


def test_a_missing_gpu_of_a_gsp_generation_gets_the_generic_causes(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '570.124.06', gpu_count: 1}\n"
               "gpus: [{name: NVIDIA A100-SXM4-80GB}, {name: NVIDIA A100-SXM4-80GB}]\n")
    [f] = d.of("gpu-not-driven", "gpu")
    assert "open kernel modules" not in f["message"] and "vfio-pci" in f["message"]
    assert "lspci -nnk" in f["fix"] and "proprietary" not in f["fix"]


@pytest.mark.parametrize("driver", [
    "driver: {present: true, version: '560.35.03'}\n",               # count absent: unknown
    "driver: {present: true, version: '560.35.03', gpu_count: 2}\n",  # all driven
])
def test_no_finding_when_the_count_is_absent_or_matches(tmp_path: Path, driver: str) -> None:
    d = doctor(tmp_path, driver + TWO)
    assert not d.of("gpu-not-driven")


def test_mig_devices_are_not_counted_as_gpus(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '570.124.06', gpu_count: 1}\n"
               "gpus:\n  - {name: NVIDIA A100-SXM4-80GB}\n"
               "  - {name: NVIDIA A100-SXM4-80GB MIG 1g.10gb, mig: {profile: 1g.10gb}}\n")
    assert not d.of("gpu-not-driven")
