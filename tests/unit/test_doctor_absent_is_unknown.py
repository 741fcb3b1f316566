"""A field a snapshot leaves out is unknown, never zero, false or "none": no error rests on it.
And a torch built from source is judged as one, not by the release wheels' arch lists."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def test_present_driver_without_gpus_is_not_a_gpu_less_driver(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {present: true, cuda: '12.1'}\n"
               "cuda_runtimes: [{version: '11.7', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n")
    assert not d.of("no-gpu") and d.data["verdict"] != "fail"
    [gpu] = d.of("not-judged", "gpu")
    assert gpu["severity"] == "info" and "absent: unknown" in gpu["message"]
    assert "nvidia-smi -L" in gpu["fix"]
    assert "not listed (unknown)" in d.text and "no GPU visible" not in d.text


def test_driver_that_counted_no_gpu_is_still_an_error(tmp_path: Path) -> None:
    """What detection writes when NVML / nvidia-smi list none: gpu_count 0."""
    d = doctor(tmp_path, "os: Linux\ndriver: {present: true, version: '550.54.15', "
               "gpu_count: 0}\ngpus: []\n")
    [f] = d.of("no-gpu", "gpu")
    assert f["severity"] == "error" and "nvidia-smi -L" in f["fix"]
    assert "no GPU visible to the driver" in d.text


def test_driver_of_unknown_version_and_no_gpus_fails_on_nothing(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true}\npackages: {torch: null, machin: null}\n")
    assert d.data["verdict"] == "pass"
    assert {f["component"] for f in d.of("not-judged")} >= {"driver", "gpu"}


def test_runtime_of_unknown_version_is_not_no_runtime(tmp_path: Path) -> None:
    """A CUDA runtime listed without its version may be of any major: a build that needs
    CUDA 12's libraries is not told that none is here."""
    base = ("os: Linux\ndriver: {version: '550.54.15'}\ngpus: [{name: NVIDIA A100-SXM4-80GB}]\n"
            "frameworks: {jax: {version: '0.4.30', jaxlib: '0.4.30', plugin: jax-cuda12-plugin, "
            "plugin_version: '0.4.30'}}\n")
    unknown = doctor(tmp_path, base + "cuda_runtimes: [{source: 'pip:nvidia-cuda-runtime'}]\n")
    assert not unknown.of("cuda-mismatch")
    other = doctor(tmp_path, base + "cuda_runtimes: [{version: '11.8', source: system}]\n")
    assert other.of("cuda-mismatch", "jax")  # a known other major is still judged


def test_source_built_torch_is_not_told_to_build_from_source(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Ubuntu 18.04\ngpus: [{name: NVIDIA GeForce GTX TITAN Black, "
               "compute_capability: '3.5'}]\n"
               "cuda_runtimes: [{version: '10.2', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"
               "frameworks: {torch: {source: 'source build (from the PyTorch repository)'}}\n")
    assert not d.of("arch-unsupported") and d.data["verdict"] == "pass"
    [f] = [f for f in d.of("not-judged", "torch") if "source build" in f["message"]]
    assert "TORCH_CUDA_ARCH_LIST" in f["message"]
    assert "CUDA 10.2 toolkit here can compile for sm_35" in f["message"]
    assert 'TORCH_CUDA_ARCH_LIST="3.5"' in f["fix"] and "torch.cuda.get_arch_list" in f["fix"]
    assert "pytorch#155314" in f["source"]


def test_source_built_torch_is_judged_by_its_own_arch_list(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {version: '470.82.01'}\n"
               "gpus: [{name: NVIDIA GeForce GTX TITAN Black}]\n"
               "frameworks: {torch: {version: 1.12.1, cuda: '11.3', arch_list: [sm_50, sm_70], "
               "installer: 'python setup.py install'}}\n")
    [f] = d.of("arch-unsupported", "torch")
    assert f["severity"] == "error" and 'TORCH_CUDA_ARCH_LIST="3.5"' in f["fix"]
    assert "no torch release build" not in f["message"]


def test_release_torch_on_kepler_is_still_told_about_release_builds(tmp_path: Path) -> None:
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GTX TITAN Black}]\n"
               "frameworks: {torch: {}}\n")
    [f] = d.of("arch-unsupported", "torch")
    assert "build torch from source" in f["fix"]


def test_cudnn_gpu_floor_is_not_judged_on_an_assumed_runtime(tmp_path: Path) -> None:
    """No CUDA runtime listed: the plugin's floor (12.1) is not "the runtime", so cuDNN's
    need of CUDA >= 12.8 on Blackwell is not an error, only not judged."""
    base = ("driver: {version: 575.57.08}\ngpus: [{name: NVIDIA RTX PRO 6000 Blackwell "
            "Workstation Edition, compute_capability: '12.0'}]\n"
            "cudnn: [{version: 9.10.2.21, source: 'pip:nvidia-cudnn-cu12', loaded_first: true}]\n"
            "frameworks: {jax: {version: 0.6.2, plugin: jax-cuda12-plugin}}\n")
    unknown = doctor(tmp_path, base)
    assert not unknown.of("cudnn-mismatch")
    assert [f for f in unknown.of("not-judged", "jax") if "CUDA >= 12.8" in f["message"]]
    known = doctor(tmp_path, base + "cuda_runtimes: [{version: '12.4', source: "
                   "'pip:nvidia-cuda-runtime-cu12'}]\n")
    assert known.of("cudnn-mismatch", "cudnn")
