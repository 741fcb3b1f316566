"""Packages of unknown version (``name: null`` in ``packages``): what holds for every build
the matrix knows is judged, the rest is said to be not judged, never passed in silence."""

from __future__ import annotations

from pathlib import Path

from dnnctl.doctor.envfile import load_env, parse_env, save_env
from tests.unit._doctor_helpers import doctor


def test_a_package_without_a_version_loads_and_round_trips(tmp_path: Path) -> None:
    env = parse_env("schema: dnnctl-env/1\npackages: {onnxruntime-gpu: null, ctranslate2: ''}\n")
    assert env.packages == {"onnxruntime-gpu": "", "ctranslate2": ""}
    assert load_env(save_env(env, tmp_path / "s.yaml")).packages == env.packages


ORT = """
os: Linux
gpus: [{name: NVIDIA A10G}]
%s
packages: {onnxruntime-gpu: null}
"""


def test_onnxruntime_of_unknown_version_with_no_cudnn_fails_for_any_version(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, ORT % "cudnn: []")
    [f] = d.of("cudnn-mismatch", "onnxruntime")
    assert f["severity"] == "error" and "whatever its version" in f["message"]
    assert "(version unknown)" in f["message"] and "CUDA 12.x / cuDNN 9" in f["message"]
    assert "nvidia-cudnn-cu12==9.*" in f["fix"] and "installed one" not in f["fix"]


def test_onnxruntime_of_unknown_version_that_some_builds_fit(tmp_path: Path) -> None:
    d = doctor(tmp_path, ORT % ('cuda_runtimes: [{version: "12.4"}]\n'
                                'cudnn: [{version: "9.1.0", source: "pip:nvidia-cudnn-cu12"}]'))
    assert not d.of("cudnn-mismatch") and not d.of("cuda-mismatch")
    [f] = d.of("not-judged", "onnxruntime")
    assert "builds for CUDA 12.x / cuDNN 9 fit" in f["message"]
    assert "CUDA 11.x / cuDNN 8" in f["message"]  # among those that do not
    assert "get_available_providers" in f["fix"]
    assert "not judged" in d.text and d.of("not-judged", "onnxruntime")


def test_onnxruntime_no_known_build_fits_is_a_warning(tmp_path: Path) -> None:
    # a release newer than the table might fit: not an error
    d = doctor(tmp_path, ORT % ('cuda_runtimes: [{version: "11.8"}]\n'
                                'cudnn: [{version: "9.1.0", source: "system:/usr/lib"}]'))
    [f] = d.of("cudnn-mismatch", "onnxruntime")
    assert f["severity"] == "warning" and "unless it is a newer release" in f["message"]


def test_onnxruntime_build_cuda_narrows_the_builds(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
os: Linux
cuda_runtimes: [{version: "12.4"}]
cudnn: [{version: "9.1.0", source: "pip:nvidia-cudnn-cu12"}]
frameworks: {onnxruntime: {cuda: "11.8", package: onnxruntime-gpu}}
""")
    [f] = d.of("cuda-mismatch", "onnxruntime")
    assert "a CUDA 11.x build" in f["message"]


def test_ctranslate2_of_unknown_version(tmp_path: Path) -> None:
    snap = "os: Linux\ngpus: [T4]\n%s\npackages: {ctranslate2: null, faster-whisper: 1.0.1}\n"
    d = doctor(tmp_path, snap % "cuda_runtimes: []")
    [f] = d.of("cuda-mismatch", "ctranslate2")
    assert f["severity"] == "error" and "(version unknown)" in f["message"]
    assert "nvidia-cublas-cu12" in f["fix"]
    d = doctor(tmp_path, snap % ('cuda_runtimes: [{version: "12.4"}]\n'
                                 'cudnn: [{version: "8.9.7", source: "pip:nvidia-cudnn-cu12"}]'))
    [f] = d.of("not-judged", "ctranslate2")
    assert "CUDA 12 / cuDNN 8" in f["message"] and "CUDA 12 / cuDNN 9" in f["message"]


def test_cuda_python_of_unknown_version_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'driver: {version: "535.54.03"}\ngpus: [A100]\n'
                         'packages: {cuda-python: null}\n')
    [f] = d.of("not-judged", "cuda-python")
    assert "CUDA major of its bindings" in f["message"]


def test_a_framework_listed_only_in_packages_is_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'os: Linux\ndriver: {version: "550.54.15"}\n'
                         'gpus: [{name: NVIDIA GeForce RTX 5090}]\n'
                         'packages: {torch: "2.2.0+cu121"}\n')
    assert d.of("arch-unsupported", "torch")
    d = doctor(tmp_path, 'os: Linux\ngpus: [A100]\npackages: {torch: null}\n')
    assert d.of("not-judged", "torch")
    d = doctor(tmp_path, 'os: Linux\ngpus: [A100]\npackages: {tensorflow-cpu: "2.15.0"}\n')
    assert d.of("cuda-mismatch", "tensorflow")  # a CPU-only package beside a GPU
