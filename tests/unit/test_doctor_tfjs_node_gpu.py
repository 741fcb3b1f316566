"""tfjs-node-gpu loads the CUDA / cuDNN of the libtensorflow it downloads (CUDA 11.2 / cuDNN
8.1 from 3.8.0 on, CUDA 10.0 / cuDNN 7.4 for 1.x), not the Python TensorFlow's."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

CUDA12 = """
cuda_runtimes: [{version: "12.3", source: "system:/usr/local/cuda"}]
cudnn: [{version: "8.9.7", source: "system"}]
frameworks:
  tensorflow: {version: "2.17.0"}
packages: {tensorflow: "2.17.0", "@tensorflow/tfjs-node-gpu": %s}
"""


def test_unknown_release_with_only_cuda_12_is_an_error_with_apt_commands(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, CUDA12 % "null")
    (f,) = d.of("cuda-mismatch", "tfjs-node-gpu")
    assert f["severity"] == "error" and "libcudart.so.11.0" in f["message"]
    assert "`sudo apt-get install cuda-libraries-11-2 libcudnn8=8.1.0.77-1+cuda11.2`" \
        in f["fix"]
    assert "export LD_LIBRARY_PATH=/usr/local/cuda-11.2/lib64" in f["fix"]
    assert d.codes("tensorflow") == set()  # the Python TensorFlow itself is fine
    assert d.data["verdict"] == "fail"


def test_known_release_is_judged_by_its_libtensorflow(tmp_path: Path) -> None:
    d = doctor(tmp_path, CUDA12 % '"4.22.0"')
    (f,) = d.of("cuda-mismatch", "tfjs-node-gpu")
    assert "libtensorflow 2.9.1" in f["message"] and "CUDA 11.2" in f["message"]
    old = doctor(tmp_path, """
cuda_runtimes: [{version: "11.2", source: "system:/usr/local/cuda-11.2"}]
cudnn: [{version: "8.1.0", source: "system"}]
packages: {"@tensorflow/tfjs-node-gpu": "1.7.4"}
""")
    (g,) = old.of("cuda-mismatch", "tfjs-node-gpu")
    assert "libtensorflow 1.15.0" in g["message"] and "libcudart.so.10.0" in g["message"]
    assert "cuda-libraries-10-0" in g["fix"]


def test_matching_cuda_11_and_cudnn_8_pass(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
cuda_runtimes:
  - {version: "12.3", source: "system:/usr/local/cuda"}
  - {version: "11.2", source: "system:/usr/local/cuda-11.2"}
cudnn: [{version: "8.1.0", source: "system"}]
packages: {"@tensorflow/tfjs-node-gpu": "4.22.0"}
""")
    assert d.codes("tfjs-node-gpu") == set() and d.codes("cudnn") == set()
    unknown = doctor(tmp_path, """
cuda_runtimes: [{version: "11.8", source: "system:/usr/local/cuda"}]
packages: {"@tensorflow/tfjs-node-gpu": null}
""")
    assert unknown.codes("tfjs-node-gpu") == set()


def test_cudnn_9_only_is_a_cudnn_mismatch(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
cuda_runtimes: [{version: "11.8", source: "system:/usr/local/cuda"}]
cudnn: [{version: "9.1.0", source: "system"}]
packages: {"@tensorflow/tfjs-node-gpu": "4.22.0"}
""")
    (f,) = d.of("cudnn-mismatch", "cudnn")
    assert "needs cuDNN 8.x" in f["message"] and "libcudnn8=8.1.0.77-1+cuda11.2" in f["fix"]
