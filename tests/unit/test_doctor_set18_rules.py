"""Rules from the eighteenth set of real reports: CUDA errors printed as bare numbers, the
program a message comes from, the C++ ABI a missing symbol was built with, a ptxas newer than
the driver, TensorFlow without its CUDA wheels, device-side asserts, GPUs known by their die."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.errors import annotate, match_error
from dnnctl.compat.gpus import resolve_gpu
from dnnctl.compat.matrix import load_matrix


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


@pytest.mark.parametrize("text, row", [
    ("Unable to load cudart library /usr/lib/ollama/libcudart.so.12.4.127: cudart init "
     "failure: 802", "fabric-not-ready"),
    ("cudaSetDevice err: 802", "fabric-not-ready"),
    ("cuInit(0) failed: 999", "cuda-unknown-error"),
    ("CUDA error 222 at /x/ggml-cuda.cu:6045: oops", "ptx-unsupported-toolchain"),
    ("cuda driver library init failure: 3", "cuda-initialization-error"),
])
def test_bare_cuda_error_numbers_are_named(matrix, text: str, row: str) -> None:
    m = match_error(matrix, text)
    assert m is not None and m.id == row
    assert m.text == " ".join(text.split())  # the message quoted as the user saw it


@pytest.mark.parametrize("text", ["CUDA error: 2.5 GB short", "CUDA error 12.1 runtime",
                                  "cudart init failure: 42", "error 802 in my parser"])
def test_other_numbers_are_left_alone(matrix, text: str) -> None:
    assert annotate(matrix, text) == text


def test_a_message_from_another_package_blames_its_build_not_torch(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'driver: {version: "525.125.06"}\n'
               'frameworks: {torch: {version: "2.1.0+cu121"}}\npackages: {ctransformers: null}\n'
               'errors: ["CUDA error 222 at /home/u/work/ctransformers/ctransformers/models/ggml/'
               'ggml-cuda.cu:6045: the provided PTX was compiled with an unsupported '
               'toolchain."]\n')
    [f] = d.of("error-message")
    assert "ctransformers's build" in f["message"] and "torch's build" not in f["message"]
    assert "a ctransformers build for CUDA 12.0 or older" in f["fix"]


@pytest.mark.parametrize("symbol_abi, torch_abi, says", [
    ("NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "false", True),
    ("NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "true", False),
    ("Ss", "true", True),
])
def test_the_missing_symbol_names_the_cxx_abi(tmp_path: Path, symbol_abi: str,
                                              torch_abi: str, says: bool) -> None:
    d = doctor(tmp_path, f'frameworks: {{torch: {{version: "2.6.0+cu124", cxx11_abi: {torch_abi}}}}}\n'
               'errors: ["ImportError: /x/flash_attn_2_cuda.so: undefined symbol: '
               f'_ZN3c105ErrorC2ENS_14SourceLocationE{symbol_abi}"]\n')
    [f] = d.of("error-message")
    assert ("C++ ABI (its missing symbol says so)" in f["message"]) is says


def _ptxas(version: str, driver: str) -> str:
    return (f'driver: {{version: "{driver}"}}\n'
            f'libraries: {{ptxas: [{{version: "{version}", source: "pip:nvidia-cuda-nvcc-cu12"}}]}}\n')


def test_a_ptxas_newer_than_the_driver_slows_xla(tmp_path: Path) -> None:
    d = doctor(tmp_path, _ptxas("12.3.107", "535.154.05"))
    [f] = d.of("ptxas-newer-driver", "ptxas")
    assert f["severity"] == "warning" and "parallel compilation" in f["message"]
    assert "pip install 'nvidia-cuda-nvcc-cu12==12.2.*'" in f["fix"]
    assert not doctor(tmp_path, _ptxas("12.2.140", "535.154.05")).of("ptxas-newer-driver")


def test_the_xla_message_points_at_the_ptxas_finding(tmp_path: Path) -> None:
    d = doctor(tmp_path, _ptxas("12.3.107", "535.154.05") + 'errors: ["The NVIDIA driver\'s '
               'CUDA version is 12.2 which is older than the ptxas CUDA version (12.3.107)."]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "info" and "ptxas-newer-driver" in f["fix"]


TF = 'gpus: [{name: A100, compute_capability: "8.0"}]\n'


def test_tensorflow_without_its_cuda_wheels_warns(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF + 'packages: {tensorflow: "2.15.0", keras: "2.15.0"}\n')
    [f] = d.of("cuda-mismatch", "tensorflow")
    assert f["severity"] == "warning" and "tensorflow[and-cuda]==2.15.*" in f["fix"]


@pytest.mark.parametrize("more", [
    'packages: {tensorflow: "2.15.0", nvidia-cudnn-cu12: "8.9.4.25"}\n',
    'packages: {tensorflow: "2.15.0"}\ncudnn: [{version: "8.9.7", source: "system:ldconfig"}]\n',
    'frameworks: {tensorflow: {version: "2.15.0"}}\n',  # no package list: unknown
])
def test_tensorflow_with_libraries_or_no_list_is_not_told_so(tmp_path: Path, more: str) -> None:
    d = doctor(tmp_path, TF + more)
    assert not [f for f in d.of("cuda-mismatch", "tensorflow") if "wheels" in f["message"]]


def test_a_device_side_assert_is_the_programs_input(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'errors: ["RuntimeError: CUDA error: device-side assert triggered"]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "warning" and "CUDA_LAUNCH_BLOCKING=1" in f["fix"]
    assert d.data["verdict"] != "fail"


@pytest.mark.parametrize("name, cc", [
    ("GP108 [GeForce GT 1030]", "6.1"), ("GK208B [GeForce GT 710]", "3.5"),
    ("TU117M [GeForce GTX 1650 Mobile / Max-Q]", "7.5"), ("GF119 [NVS 310]", "2.1"),
    ("AD107 [GeForce RTX 4060]", "8.9"), ("NVIDIA GeForce RTX 4060", "8.9"),
])
def test_a_board_is_known_by_its_die(matrix, name: str, cc: str) -> None:
    assert str(resolve_gpu(matrix, name, None).cc) == cc


def test_an_unknown_name_is_still_unknown(matrix) -> None:
    assert resolve_gpu(matrix, "GeForce GT 1030", None).cc is None
    assert resolve_gpu(matrix, "GPX123 [Something]", None).cc is None


def test_the_open_module_and_a_pascal_die_on_the_bus(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'driver: {version: "560.35.03", kernel_module_type: open, gpu_count: 0,'
               ' pci_gpus: [{slot: "0000:09:00.0", name: "GP108 [GeForce GT 1030]"}]}\n')
    [f] = d.of("kernel-module", "driver")
    assert "Pascal" in f["message"] and "proprietary" in f["fix"]


def test_notes_and_errors_may_be_one_string(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'notes: "from issue 123"\nerrors: "cudaSetDevice err: 802"\n')
    assert d.of("error-message")
