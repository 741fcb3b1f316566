"""Before CUDA 11 the runtime's soname carries the minor (libcudart.so.10.1): a build for
CUDA 10.1 does not load a 10.0 or 10.2 runtime. From CUDA 11 on, any runtime of the major
loads (libcudart.so.11.0 for every 11.x)."""

from __future__ import annotations

from _doctor_helpers import doctor


def _tf(version: str, runtimes: str) -> str:
    return (f"cuda_runtimes: [{runtimes}]\n"
            "cudnn: [{version: 7.6.5, source: 'system:/usr/lib', loaded_first: true}]\n"
            f"frameworks: {{tensorflow: {{version: {version}}}}}\n")


def test_a_cuda_10_1_build_does_not_load_a_10_2_runtime(tmp_path) -> None:
    d = doctor(tmp_path, _tf("2.2.0", "{version: '10.2', source: 'system:/usr/local/cuda'}"))
    bad = [f for f in d.of("cuda-mismatch") if "libcudart.so.10.1" in f["message"]]
    assert bad and bad[0]["severity"] == "error" and d.code == 1
    assert "the minor" in bad[0]["message"] and "10.2" in bad[0]["message"]
    assert bad[0]["evidence"]["needs_cuda"] == "10.1"


def test_the_same_minor_beside_another_loads(tmp_path) -> None:
    d = doctor(tmp_path, _tf("2.2.0", "{version: '10.2', source: 'system:/usr/local/cuda'}, "
                             "{version: '10.1', source: 'system:/usr/local/cuda-10.1'}"))
    assert not [f for f in d.of("cuda-mismatch") if "libcudart.so.10.1" in f["message"]]


def test_cuda_11_builds_take_any_11_minor(tmp_path) -> None:
    d = doctor(tmp_path, "cuda_runtimes: [{version: '11.8', source: 'system:/usr/local/cuda'}]\n"
               "cudnn: [{version: 8.1.1, source: 'system:/usr/lib', loaded_first: true}]\n"
               "frameworks: {tensorflow: {version: 2.5.0}}\n")  # built for CUDA 11.2
    assert not [f for f in d.of("cuda-mismatch") if "libcudart" in f["message"]]


def test_a_runtime_of_unknown_minor_is_not_judged(tmp_path) -> None:
    d = doctor(tmp_path, _tf("2.2.0", "{version: '10', source: 'system:/usr/local/cuda'}"))
    assert not [f for f in d.of("cuda-mismatch") if "libcudart.so.10.1" in f["message"]]


def test_the_fix_is_a_command_on_linux(tmp_path) -> None:
    d = doctor(tmp_path, "os: Ubuntu 18.04 (linux)\n"
               + _tf("2.2.0", "{version: '10.2', source: 'system:/usr/local/cuda'}"))
    bad = [f for f in d.of("cuda-mismatch") if "libcudart.so.10.1" in f["message"]]
    assert "`sudo apt-get install cuda-libraries-10-1`" in bad[0]["fix"]


def test_paddle_opens_its_cuda_libraries_by_unversioned_names(tmp_path) -> None:
    """Paddle dlopens cuBLAS / cuDNN by unversioned names (its dynamic loader): a post107
    (CUDA 10.0) wheel runs with a CUDA 10.2 runtime, so no minor is judged for it."""
    d = doctor(tmp_path, "os: Ubuntu 18.04 (linux)\n"
               "cuda_runtimes: [{version: '10.2', source: 'system:/usr/local/cuda'}]\n"
               "cudnn: [{version: 7.6.5, source: 'system:/usr/local/cuda/lib64', "
               "loaded_first: true}]\n"
               "packages: {paddlepaddle-gpu: 1.7.2.post107}\n")
    assert not [f for f in d.of("cuda-mismatch") if "libcudart" in f["message"]]
    assert d.code != 1
