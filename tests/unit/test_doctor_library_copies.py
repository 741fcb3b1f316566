"""Several copies of one CUDA library whose copy found first is of unknown version are never a
pass; a CUDA (or NVRTC) directory on LD_LIBRARY_PATH older than what the cuDNN beside it needs
is an error; NVRTC copies are detected like the other libraries."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor, probe_fakes

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.model import Component, EnvSnapshot
from dnnctl.doctor.probe_libs import probe_libraries
from dnnctl.doctor.rules import judge

CUBLAS_TWO = """libraries:
  cublas:
    - {source: "conda:/opt/conda/envs/x", path: /opt/conda/envs/x/lib/libcublas.so.11,
       loaded_first: true}
    - {source: "system:/usr/local/cuda"}
"""


def test_two_cublas_copies_first_of_unknown_version_is_a_warning(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n" + CUBLAS_TWO)
    warn = d.of("library-copies", "cublas")
    assert warn and warn[0]["severity"] == "warning"
    assert "/opt/conda/envs/x/lib/libcublas.so.11" in warn[0]["message"]
    assert "system:/usr/local/cuda" in warn[0]["message"]
    assert warn[0]["fix"].startswith("keep one copy of cuBLAS first on the search path")
    assert d.data["verdict"] == "warn"
    assert "⚠ cublas" in d.text


def test_a_known_first_copy_or_another_major_is_not_flagged(tmp_path) -> None:
    known = CUBLAS_TWO.replace("path: /opt", "version: 11.4.2.10064, path: /opt")
    assert not doctor(tmp_path, known).of("library-copies")
    other_major = CUBLAS_TWO.replace('{source: "system:/usr/local/cuda"}',
                                     '{version: 12.4.5.8, source: "pip:nvidia-cublas-cu12"}')
    assert not doctor(tmp_path, other_major).of("library-copies")


def test_cudnn_and_runtime_copies_are_covered_too(tmp_path) -> None:
    d = doctor(tmp_path, "cudnn:\n  - {source: 'env:LD_LIBRARY_PATH', path: /opt/cudnn/libcudnn.so.8,"
               " loaded_first: true}\n  - {version: 8.9.2.26, source: 'pip:nvidia-cudnn-cu12'}\n"
               "cuda_runtimes:\n  - {source: 'env:LD_LIBRARY_PATH', loaded_first: true}\n"
               "  - {version: '12.4', source: 'pip:nvidia-cuda-runtime-cu12'}\n")
    assert d.of("library-copies", "cudnn") and d.of("library-copies", "cuda")


def test_cuda_8_on_ld_library_path_before_a_cudnn_8_bundle(tmp_path) -> None:
    d = doctor(tmp_path, "cuda_runtimes:\n  - {version: '8.0', source: 'env:LD_LIBRARY_PATH', "
               "path: /opt/cuda/8.0/lib64, loaded_first: true}\n"
               "cudnn: [{version: '8', source: 'bundled:app/lib'}]\n")
    bad = d.of("library-shadowed", "cudnn")
    assert bad and bad[0]["severity"] == "error"
    assert "needs CUDA 10.2 or newer" in bad[0]["message"]
    assert "nvrtcGetCUBIN" in bad[0]["message"]
    assert bad[0]["fix"].startswith("remove /opt/cuda/8.0/lib64 from LD_LIBRARY_PATH")
    assert d.code == 1


def test_nvrtc_10_2_before_a_cuda_11_cudnn_lacks_nvrtcgetcubin(tmp_path) -> None:
    d = doctor(tmp_path, "libraries:\n  nvrtc:\n    - {version: 10.2.89, source: "
               "'env:LD_LIBRARY_PATH', path: /opt/cuda-10.2/lib64/libnvrtc.so.10.2, "
               "loaded_first: true}\n"
               "cudnn: [{version: 8.6.0.163, source: 'pip:nvidia-cudnn-cu11'}]\n")
    bad = d.of("library-shadowed", "cudnn")
    assert bad and "nvrtcGetCUBIN" in bad[0]["message"]
    assert "remove /opt/cuda-10.2/lib64 from LD_LIBRARY_PATH" in bad[0]["fix"]


def test_a_new_enough_cuda_directory_passes(tmp_path) -> None:
    d = doctor(tmp_path, "cuda_runtimes:\n  - {version: '11.8', source: 'env:LD_LIBRARY_PATH', "
               "path: /opt/cuda-11.8/lib64, loaded_first: true}\n"
               "cudnn: [{version: 8.6.0.163, source: 'pip:nvidia-cudnn-cu11'}]\n")
    assert not d.of("library-shadowed")


def test_nvrtc_copies_are_probed_with_their_versions(tmp_path: Path) -> None:
    fakes = probe_fakes()
    files = {"/opt/cuda/8.0/lib64/libnvrtc.so.8.0.61": None,
             "/opt/cuda/8.0/lib64/libnvrtc.so.8.0": fakes.Link("libnvrtc.so.8.0.61"),
             "/opt/cuda/8.0/lib64/libnvrtc-builtins.so.8.0": None}
    host = fakes.make_host(tmp_path, files=files, environ={
        "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/8.0/lib64"})
    fakes.make_dist(tmp_path / "site", "nvidia-cuda-nvrtc-cu12", "12.4.127",
                    {"nvidia/cuda_nvrtc/lib/libnvrtc.so.12": None})
    dists, _ = host.distributions(lambda n: n.startswith("nvidia-"))
    libs = probe_libraries(host, dists, {})
    assert [(c.version, c.source, c.loaded_first) for c in libs["nvrtc"]] == [
        ("8.0.61", "env:LD_LIBRARY_PATH", True), ("12.4.127", "pip:nvidia-cuda-nvrtc-cu12", True)]
    env = EnvSnapshot(libraries=libs, cudnn=[Component(version="8.9.2.26",
                                                       source="pip:nvidia-cudnn-cu12")])
    found = [f for f in judge(env, load_matrix()) if f.code == "library-shadowed"]
    assert found and "NVRTC 8.0.61" in found[0].message
    # cuDNN 9 loads libnvrtc.so.12: a CUDA 8 directory cannot stand in for it
    env.cudnn = [Component(version="9.1.0.70", source="pip:nvidia-cudnn-cu12")]
    assert not [f for f in judge(env, load_matrix()) if f.code == "library-shadowed"]
