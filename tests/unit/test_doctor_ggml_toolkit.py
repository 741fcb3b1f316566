"""A CUDA build of llama-cpp-python is compiled by the nvcc here: older than 11.7 (the oldest
toolkit llama.cpp's maintainers test the build with) is a warning with a runnable rebuild."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def _kit(d):  # noqa: ANN001, ANN202
    return [f for f in d.of("cuda-mismatch", "llama-cpp-python")
            if "tested_from" in f["evidence"]]


def test_nvcc_9_1_gets_a_toolkit_and_a_rebuild_pointed_at_it(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
cuda_runtimes: [{version: "9.1", source: "nvcc:/usr/bin/nvcc"}]
frameworks:
  llama-cpp-python: {version: "0.2.23", cuda_build: true}
""")
    (f,) = _kit(d)
    assert f["severity"] == "warning" and "CUDA 9.1 toolkit" in f["message"]
    assert f["evidence"] == {"toolkit": "9.1", "tested_from": "11.7"}
    assert "`sudo apt-get install cuda-toolkit-12-" in f["fix"]  # GPU unknown: CUDA 12 at most
    assert "`export CUDACXX=/usr/local/cuda-12." in f["fix"]
    assert "`export CMAKE_ARGS=\"-DLLAMA_CUBLAS=on\"`" in f["fix"]  # this release's flag
    assert "`pip install --upgrade --force-reinstall --no-cache-dir llama-cpp-python==0.2.23`" \
        in f["fix"]


def test_a_newer_toolkit_beside_it_is_named_and_nothing_is_installed(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
cuda_runtimes:
  - {version: "10.1", source: "nvcc:/usr/bin/nvcc"}
  - {version: "12.4", source: "system:/usr/local/cuda-12.4"}
frameworks:
  llama-cpp-python: {version: "0.3.2", cuda_build: true}
""")
    (f,) = _kit(d)
    assert "apt-get" not in f["fix"] and "/usr/local/cuda-12.4/bin/nvcc" in f["fix"]
    assert "-DGGML_CUDA=on" in f["fix"]


def test_tested_toolkit_or_cpu_build_is_not_flagged(tmp_path: Path) -> None:
    ok = doctor(tmp_path, """
cuda_runtimes: [{version: "11.7", source: "nvcc:/usr/local/cuda/bin/nvcc"}]
frameworks:
  llama-cpp-python: {version: "0.3.2", cuda_build: true}
""")
    assert _kit(ok) == []
    cpu = doctor(tmp_path, """
cuda_runtimes: [{version: "9.1", source: "nvcc:/usr/bin/nvcc"}]
frameworks:
  llama-cpp-python: {version: "0.3.2", cuda_build: false}
""")
    assert _kit(cpu) == []
