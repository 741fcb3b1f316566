"""Rules from the nineteenth set of real reports: onnxruntime's cuDNN major read from its
message, a feature the GPU lacks as the program's choice (a warning), NVML's 'Unknown Error' in
a container, data-center GPUs in WSL 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

ORT = ("errors: [\"Failed to create CUDAExecutionProvider. Require cuDNN 8.* and CUDA 12.*. "
       "Please install all dependencies as mentioned in the GPU requirements page\"]\n"
       "packages: {onnxruntime-gpu: \"1.19.0\"}\n")


def test_onnxruntime_names_the_cudnn_major_it_wants(tmp_path: Path) -> None:
    d = doctor(tmp_path, ORT + 'cudnn: [{version: "9.3", source: "system:ldconfig"}]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "error" and "no cudnn 8 is installed here" in f["message"]
    d = doctor(tmp_path, ORT + 'cudnn: [{version: "8.9.7", source: "system:ldconfig"}]\n')
    [f] = d.of("error-message")  # cuDNN 8 is here: not "absent"
    assert "no cudnn 8 is installed" not in f["message"]


def test_bfloat16_on_an_older_gpu_is_the_programs_choice(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'gpus: [{name: "Tesla V100-SXM2-32GB"}]\nerrors: ["ValueError: '
               'Bfloat16 is only supported on GPUs with compute capability of at least 8.0. '
               'Your Tesla V100-SXM2-32GB GPU has compute capability 7.0."]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "warning" and "--dtype half" in f["fix"]
    assert d.data["verdict"] == "warn"


@pytest.mark.parametrize("system, likely", [("system: {container: docker}\n", True), ("", False)])
def test_nvml_unknown_error(tmp_path: Path, system: str, likely: bool) -> None:
    d = doctor(tmp_path, system + 'driver: {version: "510.68.02"}\n'
               'errors: ["Failed to initialize NVML: Unknown Error"]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "warning" and f["evidence"]["error_row"] == "nvml-unknown-error"
    assert ("Likely here: in a container" in f["message"]) is likely


WSL = 'os: "Ubuntu 22.04 (WSL 2)"\n'


def test_a_datacenter_gpu_in_wsl_may_be_in_tcc(tmp_path: Path) -> None:
    d = doctor(tmp_path, WSL + 'gpus: [{name: "NVIDIA H100 PCIe"}]\n')
    [f] = d.of("platform-unsupported", "gpu")
    assert f["severity"] == "warning" and "-dm 0" in f["fix"]


@pytest.mark.parametrize("text", [
    WSL + 'gpus: [{name: "NVIDIA GeForce RTX 4090"}]\n',  # a GeForce runs WDDM
    WSL + 'gpus: [{name: "NVIDIA H100 PCIe"}]\ndriver: {version: "560.94", gpu_count: 1}\n',
    'os: "Ubuntu 22.04"\ngpus: [{name: "NVIDIA H100 PCIe"}]\n',  # not WSL
])
def test_no_tcc_warning_where_it_cannot_apply(tmp_path: Path, text: str) -> None:
    assert not doctor(tmp_path, text).of("platform-unsupported", "gpu")
