"""A TensorFlow CUDA build known only by its CUDA major, with no runtime of that major."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

WSL = 'os: "Windows + WSL2 (Linux)"\n'


def test_tf_cuda11_with_no_runtime_found_fails_with_the_install(tmp_path: Path) -> None:
    d = doctor(tmp_path, WSL + "cuda_runtimes: []\nframeworks:\n  tensorflow: {cuda: \"11\"}\n"
               "packages: {tensorflow: null}\n")  # Melting-Pot-Contest-2023#6
    [f] = d.of("cuda-mismatch", "tensorflow")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "libcudart.so.11" in f["message"] and "runs on the CPU only" in f["message"]
    commands = d.text.split("commands (one per line):")[1]
    assert "conda install -c conda-forge cudatoolkit=11.2 cudnn=8.1.0" in commands
    assert "export LD_LIBRARY_PATH=$CONDA_PREFIX/lib:$LD_LIBRARY_PATH" in commands
    assert "Melting-Pot-Contest-2023#6" in f["source"]


def test_an_absent_runtime_list_is_unknown_not_none(tmp_path: Path) -> None:
    d = doctor(tmp_path, WSL + 'frameworks:\n  tensorflow: {cuda: "11"}\n')
    assert not d.of("cuda-mismatch")


def test_a_runtime_of_the_builds_major_passes(tmp_path: Path) -> None:
    d = doctor(tmp_path, WSL + 'cuda_runtimes: [{version: "11.8", source: "conda:/opt/env"}]\n'
               'frameworks:\n  tensorflow: {cuda: "11"}\n')
    assert not d.of("cuda-mismatch")


def test_a_cuda12_build_gets_the_and_cuda_extra(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'cuda_runtimes: [{version: "11.8", source: "system:ldconfig"}]\n'
               'frameworks:\n  tensorflow: {version: "2.99.0", cuda: "12.5"}\n')
    [f] = d.of("cuda-mismatch", "tensorflow")
    assert 'pip install "tensorflow[and-cuda]==2.99.0"' in f["fix"]


def test_a_release_with_a_row_is_left_to_the_release_rules(tmp_path: Path) -> None:
    d = doctor(tmp_path, "cuda_runtimes: []\nframeworks:\n  tensorflow: {version: \"2.15.0\", "
               "cuda: \"12.2\"}\n")
    # judged once, by the release's own libraries (its and-cuda install)
    found = d.of("cuda-mismatch", "tensorflow")
    assert len(found) == 1 and "tensorflow[and-cuda]==2.15.*" in found[0]["fix"]


def test_a_cpu_build_and_native_windows_are_not_judged_here(tmp_path: Path) -> None:
    cpu = 'cuda_runtimes: []\nframeworks:\n  tensorflow: {cuda: "11", cuda_build: false}\n'
    assert not doctor(tmp_path, cpu).of("cuda-mismatch")
    win = 'os: "Windows 10"\ncuda_runtimes: []\nframeworks:\n  tensorflow: {cuda: "11"}\n'
    assert not doctor(tmp_path, win).of("cuda-mismatch", "tensorflow")
