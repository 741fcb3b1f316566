"""A torch with no CUDA beside add-ons built for CUDA (an error where a GPU is listed, else a
warning, fixed by the CUDA torch the add-on matches), and conda's CPU variant of pytorch."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

GPU = 'gpus: [{name: NVIDIA A100-SXM4-80GB}]\ndriver: {version: "550.54.14"}\n'
CPU_TORCH = 'frameworks:\n  torch: {version: "2.1.0+cpu"}\n'
XFORMERS = '  xformers: {torch: "2.1.0+cu121", cuda: "12.1"}\n'
EXACT = "pip install 'torch==2.1.0+cu121' -i https://download.pytorch.org/whl/cu121"


def test_a_cuda_xformers_beside_a_cpu_torch_warns_on_both_with_the_torch_it_was_built_for(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, CPU_TORCH + XFORMERS + 'packages: {torch: "2.1.0+cpu", xformers: null}\n')
    [torch] = d.of("cuda-mismatch", "torch")
    [xf] = d.of("cuda-mismatch", "xformers")
    assert torch["severity"] == xf["severity"] == "warning"
    assert "CPU-only" in torch["message"] and "2.1.0+cu121" in torch["message"]
    assert torch["fix"].startswith(f"`{EXACT}`") and xf["fix"] == torch["fix"]
    assert not d.of("ok", "xformers") and not d.of("ok", "torch")
    assert EXACT in d.text


def test_with_a_gpu_listed_it_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, GPU + CPU_TORCH + XFORMERS)
    assert {f["severity"] for f in d.of("cuda-mismatch")} == {"error"}
    assert d.data["verdict"] == "fail" and d.code == 1


def test_a_cu_tagged_torchvision_gives_its_cuda_with_the_torch_release_here(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, 'packages: {torch: "2.2.0+cpu", torchvision: "0.17.0+cu118"}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "warning" and "torchvision 0.17.0+cu118" in f["message"]
    assert f["fix"].startswith("`pip install 'torch==2.2.0+cu118' -i "
                               "https://download.pytorch.org/whl/cu118`")


@pytest.mark.parametrize("package", ["flash-attn: 2.5.8", "vllm: 0.4.2",
                                     "bitsandbytes: 0.41.1"])
def test_an_untagged_cuda_addon_with_a_gpu_removes_the_cpu_torch_first(
        tmp_path: Path, package: str) -> None:
    d = doctor(tmp_path, GPU + f'packages: {{torch: "2.1.0+cpu", {package}}}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "error" and package.split(":")[0] in f["message"]
    # `torch==2.1.*` alone is already satisfied by 2.1.0+cpu: the CPU build goes first
    assert f["fix"].startswith("`pip uninstall -y torch`, then `pip install 'torch==")
    assert "download.pytorch.org/whl/cu" in f["fix"]


@pytest.mark.parametrize("package", ["bitsandbytes: 0.48.1", "vllm: 0.6.0+cpu", "numpy: 1.26.4"])
def test_addons_with_a_cpu_build_are_not_counted(tmp_path: Path, package: str) -> None:
    d = doctor(tmp_path, f'packages: {{torch: "2.1.0+cpu", {package}}}\n')
    assert not d.of("cuda-mismatch") and d.of("ok", "torch")


def test_a_cuda_torch_beside_xformers_is_not_this_rule(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'frameworks:\n  torch: {version: "2.1.0+cu121"}\n' + XFORMERS)
    assert not d.of("cuda-mismatch") and d.of("ok", "xformers")


CONDA_FIX = "`conda install -c conda-forge \"pytorch=*=cuda*\"`"


def test_a_conda_forge_torch_with_cuda_unavailable_and_no_cuda_build_is_the_cpu_variant(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, 'frameworks:\n  torch: {source: "conda:conda-forge", '
               'cuda_available: false}\npackages: {cudatoolkit: "10.2"}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "warning" and "CPU variant" in f["message"]
    assert f["fix"].startswith(CONDA_FIX)
    assert 'conda install -c conda-forge "pytorch=*=cuda*"' in d.text


def test_a_known_cpu_conda_torch_on_a_gpu_gets_the_conda_forge_cuda_variant(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, GPU + 'frameworks:\n  torch: {version: "2.4.1", installer: conda, '
               'cuda_build: false}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["fix"].startswith(CONDA_FIX) and "pytorch-cpu-feedstock" in f["source"]


@pytest.mark.parametrize("torch", ['{source: "conda:conda-forge", cuda: "12.1", '
                                   'cuda_available: false}',
                                   '{source: "pip", cuda_available: false}',
                                   '{source: "conda:pytorch", cuda_available: false}'])
def test_cuda_unavailable_alone_is_not_called_a_cpu_variant(tmp_path: Path, torch: str) -> None:
    d = doctor(tmp_path, f"frameworks:\n  torch: {torch}\n")
    assert not any("CPU variant" in f["message"] for f in d.findings)
