"""The GPUs a TensorRT release has kernels for (compat/limits.yaml tensorrt_gpus), through the
real `dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor


def test_a_gpu_newer_than_the_release_is_an_error_naming_the_first_release_for_it(tmp_path):
    """NVIDIA/TensorRT#2332: TensorRT 7.0.0.11 on an RTX A6000 (8.6): 'Unsupported SM'."""
    d = doctor(tmp_path, "driver: {version: 515.65.01}\n"
               "gpus: [{name: NVIDIA RTX A6000, compute_capability: '8.6'}]\n"
               "cuda_runtimes: [{version: '10.2'}]\n"
               "frameworks: {tensorrt: {version: 7.0.0.11, cuda: '10.2'}}\n")
    [f] = d.of("arch-unsupported", "tensorrt")
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith("TensorRT 7.0.0.11 has no kernels for NVIDIA RTX A6000 "
                                   "(compute capability 8.6, Ampere): its newest supported "
                                   "compute capability is 7.5")
    assert "'Unsupported SM'" in f["message"]
    assert f["fix"].startswith("install TensorRT 7.2.1 or later in a build for CUDA 11.1 or later")
    assert "the driver here runs CUDA 11.7" in f["fix"]
    assert "NVIDIA/TensorRT#2332" in f["source"] and "compat/limits.yaml" in f["source"]
    assert f["evidence"]["max_cc"] == "7.5" and "min_cc" not in f["evidence"]


def test_a_gpu_older_than_the_release_names_the_last_release_for_it(tmp_path):
    """NVIDIA/TensorRT#3589: TensorRT 8.6.1.6 on a GT 730 (Kepler, 3.5); #3826: 10.0.1 on a
    GTX 1080 Ti (6.1)."""
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GT 730, compute_capability: '3.5'}]\n"
               "packages: {tensorrt: 8.6.1.6}\n")
    [f] = d.of("arch-unsupported", "tensorrt")
    assert "its oldest supported compute capability is 6.0" in f["message"]
    assert f["fix"].startswith("install a release before 8.6, the last with kernels for "
                               "compute capability 3.5")
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GTX 1080 Ti}]\n"
               "packages: {tensorrt-cu12: 10.0.1}\n")
    [f] = d.of("arch-unsupported", "tensorrt")
    assert f["message"].startswith("TensorRT 10.0.1 has no kernels for NVIDIA GeForce GTX 1080 "
                                   "Ti (compute capability 6.1, Pascal)")
    assert f["fix"].startswith("install a release before 10.0,")


def test_supported_uncertain_unknown_release_and_the_newest_range(tmp_path):
    ok = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090}]\n"
                "frameworks: {tensorrt: {version: 8.4.1.5, cuda: '11.6'}}\n")
    assert ok.of("arch-unsupported") == [] and ok.of("unknown-version", "tensorrt") == []
    hopper = doctor(tmp_path, "gpus: [{name: NVIDIA H100 80GB HBM3}]\n"
                    "frameworks: {tensorrt: {version: 8.6.1.6, cuda: '12.0'}}\n")
    [f] = hopper.of("unknown-version", "tensorrt")
    assert "whether it has kernels for NVIDIA H100 80GB HBM3 (compute capability 9.0)" \
        in f["message"]
    unknown = doctor(tmp_path, "gpus: [{name: NVIDIA RTX A6000}]\npackages: {tensorrt: null}\n")
    assert unknown.of("arch-unsupported") == []
    # the newest releases are open upwards: a newer GPU is not ruled out
    newest = doctor(tmp_path, "gpus: [{compute_capability: '13.0'}]\n"
                    "packages: {tensorrt-cu13: 11.2.1}\n")
    assert newest.of("arch-unsupported", "tensorrt") == []
