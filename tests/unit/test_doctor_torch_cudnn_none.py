"""An explicit ``cudnn: []`` against the cuDNN a torch wheel is assumed to bring: it overrides
the assumption for a conda / custom build (they link the cuDNN the loader finds) and for a PyPI
wheel whose listed packages lack its nvidia-cudnn dependency; otherwise the wheel's own copy is
still assumed, and said to be."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "550.54.15"}
gpus: [{name: NVIDIA A100-SXM4-80GB}]
%s
frameworks:
  torch: %s
%s
"""


def test_conda_torch_with_no_cudnn_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.1.0", installer: conda}', ""))
    [f] = d.of("cudnn-mismatch", "cudnn")
    assert f["severity"] == "error" and "a conda build" in f["message"]
    assert "libcudnn.so.8: cannot open shared object file" in f["message"]
    assert "conda install 'cudnn=8.*'" in f["fix"]
    assert "pytorch-cpu-feedstock" in f["source"]
    assert d.data["verdict"] == "fail"


def test_conda_torch_with_cudnn_unknown_keeps_the_old_verdict(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("", '{version: "2.1.0", installer: conda}', ""))
    assert not d.of("cudnn-mismatch")
    assert d.data["verdict"] == "pass"


def test_custom_build_with_no_cudnn(tmp_path: Path) -> None:
    # NGC / source builds: 2.3.0a0+<sha>, linking the system cuDNN
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.3.0a0+git6c8c5ad", cuda: "12.1"}',
                                 ""))
    [f] = d.of("cudnn-mismatch", "cudnn")
    assert f["severity"] == "warning"  # it may have been built without cuDNN
    assert "custom build" in f["message"] and "built without cuDNN" in f["message"]
    assert "LD_LIBRARY_PATH" in f["fix"]
    # with its compiled cuDNN known it is an error
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.3.0a0+git6c8c5ad", cuda: "12.1", '
                                 'cudnn_compiled: "8.9.7"}', ""))
    [f] = d.of("cudnn-mismatch", "cudnn")
    assert f["severity"] == "error" and "built against cuDNN 8.9.7" in f["message"]


def test_pypi_wheel_without_its_cudnn_dependency(tmp_path: Path) -> None:
    pkgs = 'packages: {torch: "2.4.0", nvidia-cublas-cu12: "12.1.3.1"}'
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.4.0"}', pkgs))
    [f] = d.of("cudnn-mismatch", "cudnn")
    assert f["severity"] == "error" and "--no-deps" in f["message"]
    assert "libcudnn.so.9" in f["message"]
    assert f["fix"] == "pip install 'nvidia-cudnn-cu12==9.1.0.70'"


def test_detected_cudnn_package_names_the_fix(tmp_path: Path) -> None:
    torch = '{version: "2.6.0+cu126", cudnn: "9.5.1.17", cudnn_package: nvidia-cudnn-cu12}'
    d = doctor(tmp_path, SNAP % ("cudnn: []", torch, 'packages: {torch: "2.6.0+cu126"}'))
    [f] = d.of("cudnn-mismatch", "cudnn")
    assert f["fix"] == "pip install 'nvidia-cudnn-cu12==9.5.1.17'"


def test_pypi_wheel_with_its_cudnn_package_listed_is_fine(tmp_path: Path) -> None:
    pkgs = 'packages: {torch: "2.4.0", nvidia-cudnn-cu12: "9.1.0.70"}'
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.4.0"}', pkgs))
    assert not d.of("cudnn-mismatch") and d.data["verdict"] == "pass"


def test_wheel_without_packages_listed_is_assumed_and_said(tmp_path: Path) -> None:
    # a report's "cuDNN version: Could not collect" speaks of system copies only
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.4.0+cu121"}', ""))
    assert not d.of("cudnn-mismatch")
    [f] = d.of("not-judged", "cudnn")
    assert "assumed present" in f["message"] and "cuDNN 9" in f["message"]
    assert d.data["verdict"] == "pass"


def test_onnxruntime_beside_a_conda_torch_with_no_cudnn(tmp_path: Path) -> None:
    # torch's assumed cuDNN 9 no longer satisfies onnxruntime-gpu when the snapshot has none
    extra = 'packages: {onnxruntime-gpu: "1.19.2"}\ncuda_runtimes: [{version: "12.4"}]'
    d = doctor(tmp_path, SNAP % ("cudnn: []", '{version: "2.4.0", installer: conda}', extra))
    assert d.of("cudnn-mismatch", "onnxruntime")
    d = doctor(tmp_path, SNAP % ("", '{version: "2.4.0", installer: conda}', extra))
    assert not d.of("cudnn-mismatch", "onnxruntime")
