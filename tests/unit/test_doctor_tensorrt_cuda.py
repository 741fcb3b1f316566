"""TensorRT is built per CUDA major: a build needs a CUDA runtime of its major."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

CUDA117 = "cuda_runtimes: [{version: '11.7', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"


def test_cuda12_build_on_a_cuda11_machine_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {present: true, cuda: '12.1'}\n" + CUDA117
               + "frameworks: {tensorrt: {version: 8.6.1.6, cuda: '12.1'}}\n")
    [f] = d.of("cuda-mismatch", "tensorrt")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "CUDA 12 build" in f["message"] and "11.x" in f["message"]
    assert "libcublas.so.12" in f["message"]
    assert "TensorRT 8.6.1 built for CUDA 11" in f["fix"] and "cuda-11" in f["fix"]
    assert "tensorrt-cu11" not in f["fix"]  # 8.6 has no tensorrt-cuNN wheel
    assert "libcublas.so.12, libcublasLt.so.12" in f["message"] and "libraries.yaml" in f["source"]
    assert "support-matrix" in f["source"] and "tensorrt-cpp-api#45" in f["source"]
    assert not d.of("no-gpu")


def test_pip_wheel_of_another_major_names_the_wheel_for_this_cuda(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\n" + CUDA117 + "packages: {tensorrt-cu12: '10.3.0'}\n")
    [f] = d.of("cuda-mismatch", "tensorrt")
    assert f["severity"] == "warning" and "nvidia-cuda-runtime-cu12" in f["message"]
    assert "pip install 'tensorrt-cu11==10.3.0'" in f["fix"]


def test_a_release_without_a_build_for_this_cuda_names_one_with_it(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\n" + CUDA117 + "packages: {tensorrt-cu12: '10.14.1'}\n")
    [f] = d.of("cuda-mismatch", "tensorrt")
    assert "TensorRT >=10.0, <10.13.2 built for CUDA 11" in f["fix"]
    assert "pip install 'tensorrt-cu11<10.13.2'" in f["fix"]


def test_matching_major_passes(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {version: '550.54.15'}\n"
               "gpus: [{name: NVIDIA L4}]\n"
               "cuda_runtimes: [{version: '12.4', source: 'pip:nvidia-cuda-runtime-cu12'}]\n"
               "packages: {tensorrt-cu12: '10.3.0', tensorrt-cu12-libs: '10.3.0'}\n")
    assert not [f for f in d.findings if f["component"] == "tensorrt"
                and f["severity"] != "info"]


def test_driver_too_old_for_the_build(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {version: '470.82.01'}\n"
               "gpus: [{name: NVIDIA A10}]\n"
               "cuda_runtimes: [{version: '12.2', source: 'system:/usr/local/cuda-12.2'}]\n"
               "frameworks: {tensorrt: {version: 8.6.1.6, cuda: '12.0'}}\n")
    assert d.of("driver-too-old", "tensorrt")


def test_unknown_build_or_runtimes_are_said_not_assumed(tmp_path: Path) -> None:
    no_major = doctor(tmp_path, "os: Linux\n" + CUDA117 + "packages: {tensorrt: '8.6.1'}\n")
    [f] = no_major.of("not-judged", "tensorrt")
    assert "frameworks.tensorrt.cuda" in f["fix"] and not no_major.of("cuda-mismatch")
    no_runtime = doctor(tmp_path, "os: Linux\nframeworks: {tensorrt: {cuda: '12.0'}}\n")
    [g] = no_runtime.of("not-judged", "tensorrt")
    assert "CUDA 12.x runtime" in g["message"] and not no_runtime.of("cuda-mismatch")
