"""Releases older than the first rows the matrix had (TensorFlow < 2.5, torch < 1.13) are
judged from their sourced rows, through the real doctor, instead of `unknown-version`."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

# tensorflow-gpu 1.13.1 is the first built against CUDA 10.0; CUDA 9.0 installed
# (tensorflow/tensorflow#26209: 'libcublas.so.10.0: cannot open shared object file')
TF_OLD = """
python: "3.5.2"
gpus: [{name: NVIDIA TITAN Xp}]
cuda_runtimes: [{version: "%s", source: "system:/usr/local/cuda"}]
frameworks:
  tensorflow: {version: "%s", package: tensorflow-gpu}
"""


def test_tf_113_on_cuda_90_is_a_cuda_mismatch(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_OLD % ("9.0", "1.13.1"))
    assert d.data["verdict"] == "fail"
    [f] = d.of("cuda-mismatch", "tensorflow")
    assert f["severity"] == "error"
    assert f["evidence"]["needs_cuda_major"] == 10
    assert "libcudart.so.10.0" in f["message"]  # pre-11 sonames carry the minor
    assert "CUDA 10.0" in f["fix"]
    assert "tensorflow_gpu-1.13.1" in f["source"]
    assert "no tested configuration" not in d.text


def test_tf_112_on_cuda_90_is_no_cuda_mismatch(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_OLD % ("9.0", "1.12.0"))
    assert "cuda-mismatch" not in d.codes()
    assert d.data["verdict"] != "fail"
    assert "no tested configuration" not in d.text


def test_tf_113_on_cuda_100_is_fine(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_OLD % ("10.0", "1.13.1"))
    assert "cuda-mismatch" not in d.codes()
    assert d.data["verdict"] != "fail"


def test_tf_24_needs_cuda_11_and_python_range_is_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_OLD % ("10.1", "2.4.0"))
    assert d.of("cuda-mismatch", "tensorflow")[0]["evidence"]["needs_cuda_major"] == 11
    # 2.4 was tested with Python 3.6-3.8: 3.5.2 is outside it
    [f] = d.of("python-version", "tensorflow")
    assert f["severity"] == "error" and ">=3.6, <3.9" in f["message"]


def test_tf_24_with_python_38_has_no_python_finding(tmp_path: Path) -> None:
    d = doctor(tmp_path, (TF_OLD % ("11.0", "2.4.0")).replace("3.5.2", "3.8.10"))
    assert not d.of("python-version")
    assert "cuda-mismatch" not in d.codes()


def test_tf_old_rows_have_no_arch_list_and_say_so(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_OLD % ("10.0", "1.13.1"))
    assert "the matrix has no arch list for this build" in d.text
    assert "None arch list" not in d.text
