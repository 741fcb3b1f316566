"""Releases older than the first rows the matrix had (TensorFlow < 2.5, torch < 1.13) are
judged from their sourced rows, through the real doctor, instead of `unknown-version`."""

from __future__ import annotations

from pathlib import Path

from dnnctl.compat.matrix import load_matrix
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


# torch 1.1.0 built for CUDA 9.0 (cubins sm_35 ... sm_70, conda package in moi90 table.md)
TORCH_11 = """
driver: {version: "%s"}
gpus: [{name: %s}]
frameworks:
  torch: {version: "1.1.0", cuda: "9.0.176"}
"""


def test_torch_11_cu90_on_an_sm80_gpu_has_no_kernel(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_11 % ("450.80.02", "NVIDIA A100-SXM4-40GB"))
    assert d.data["verdict"] == "fail"
    [f] = d.of("arch-unsupported", "torch")
    assert f["severity"] == "error"
    assert "sm_80" in f["message"] and "cu90" in f["message"]
    assert "sm_70" in f["evidence"]["arch_list"] and "sm_80" not in f["evidence"]["arch_list"]
    assert "previous-versions" in f["source"]
    assert "has no rows in the matrix" not in d.text


def test_torch_11_cu90_on_a_pascal_gpu_has_code(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_11 % ("418.39", "GeForce GTX 1080"))
    assert "arch-unsupported" not in d.codes()
    assert d.data["verdict"] != "fail"
    assert "has no rows in the matrix" not in d.text


def test_torch_old_line_variants_and_cudnn() -> None:
    m = load_matrix()
    assert {r["variant"] for r in m.torch_rows("1.7")} == {"cu92", "cu101", "cu102", "cu110"}
    assert m.torch_row("1.1", "cu100")["cudnn"] == "7.5.1"
    assert "cudnn" not in m.torch_row("1.7", "cu110")  # 1.7.0 and 1.7.1 disagree (8.0.3/8.0.5)


def test_torch_old_cudnn_fix_names_no_pip_package_before_cuda_11(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_11 % ("418.39", "GeForce GTX 1080") + """
cudnn:
  - {version: "7.0.3", source: "system:/usr/local/cuda-9.0", path: /usr/local/cuda-9.0/lib64/libcudnn.so.7, loaded_first: true}
""")
    [f] = d.of("cudnn-shadowed")
    assert f["severity"] == "error"
    assert "nvidia-cudnn-cu9" not in f["fix"] and "cuDNN 7.5 or newer" in f["fix"]


def test_cc30_gpu_still_has_no_torch_release_build(tmp_path: Path) -> None:
    # conda 1.0.0 / 1.3.0 cu100 carried sm_30 cubins, but torch 1.x rejects cc 3.0 itself
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GT 740M, compute_capability: '3.0'}]\n"
               "frameworks:\n  torch: {}\n")
    [f] = [f for f in d.of("arch-unsupported", "torch") if f["severity"] == "error"]
    assert "1.13-2.15" in f["message"]  # old lines judge an installed build, never suggested
    assert 'TORCH_CUDA_ARCH_LIST="3.0"' in f["fix"]


def test_torch_cu102_wheel_with_only_a_system_cudnn_8_is_no_mismatch(tmp_path: Path) -> None:
    # pytorch/pytorch#57922: 1.8.1+cu102 beside a system cuDNN 8.1.0; the wheel carries its 7.6.5
    d = doctor(tmp_path, """
driver: {version: "450.80.02"}
gpus: [{name: GeForce GTX 1080}]
cudnn: [{version: "8.1.0", source: "system:/usr/lib/x86_64-linux-gnu"}]
frameworks:
  torch: {version: "1.8.1+cu102", cuda: "10.2"}
""")
    assert not d.of("cudnn-mismatch")
    assert d.data["verdict"] != "fail"
