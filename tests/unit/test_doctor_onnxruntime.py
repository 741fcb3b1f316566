"""onnxruntime-gpu against the CUDA and cuDNN found beside it (ONNX Runtime CUDA EP
requirements: a CUDA 12 build needs a CUDA 12.x runtime, cuDNN 8 and 9 builds are not
interchangeable; from 1.19 PyPI has the CUDA 12 / cuDNN 9 build), judged by the real doctor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_python import probe_python

LINUX = "os: Linux\ndriver: {version: 570.124.06}\ngpus: [{name: NVIDIA A100-SXM4-80GB}]\n"


def _snap(ort: str, *, cuda: str | None = None, cudnn: str | None = None,
          torch: str | None = None, os_line: str = LINUX) -> str:
    text = os_line
    if cuda:
        text += f'cuda_runtimes: [{{version: "{cuda}", source: "system:/usr/local/cuda"}}]\n'
    if cudnn:
        text += f'cudnn: [{{version: "{cudnn}", source: "pip:nvidia-cudnn-cu12"}}]\n'
    if torch:
        text += f'frameworks: {{torch: {{version: "{torch}"}}}}\n'
    return text + f'packages: {{onnxruntime-gpu: "{ort}"}}\n'


def test_a_cudnn9_build_beside_torchs_cudnn8_fails(tmp_path: Path) -> None:
    # microsoft/onnxruntime#22198: 1.19.2 beside nvidia-cudnn-cu12 8.9.2.26 -> libcudnn.so.9
    got = doctor(tmp_path, _snap("1.19.2", cuda="12.1", cudnn="8.9.2.26"))
    [f] = got.of("cudnn-mismatch", "onnxruntime")
    assert f["severity"] == "error" and "libcudnn.so.9" in f["message"]
    assert f["evidence"]["needs_cudnn"] == 9 and f["evidence"]["cudnn_found"] == [8]
    assert ">=1.17,<1.18.1" in f["fix"] and "cuDNN 8" in f["fix"]
    # torch 2.3.1 (cuDNN 8.9.2.26 pinned) brings the same: the fix says to keep its major
    t = doctor(tmp_path, _snap("1.19.2", torch="2.3.1"))
    assert "keep that major" in t.of("cudnn-mismatch", "onnxruntime")[0]["fix"]
    # and torch 2.4.1 (cuDNN 9) is what 1.19 is built for
    ok = doctor(tmp_path, _snap("1.19.2", torch="2.4.1"))
    assert ok.codes("onnxruntime") == set() and ok.of("ok", "onnxruntime")


def test_a_cuda12_build_on_a_cuda11_machine(tmp_path: Path) -> None:
    # microsoft/onnxruntime#21769: Windows, CUDA 11.7, onnxruntime-gpu 1.19.0 from PyPI
    got = doctor(tmp_path, _snap("1.19.0", cuda="11.7", os_line="os: Windows\n"))
    [f] = got.of("cuda-mismatch", "onnxruntime")
    assert "cudart64_12.dll" in f["message"] and "Require cuDNN 9.* and CUDA 12.*" in f["message"]
    assert "CUDA 11.x" in f["fix"] and "onnxruntime-gpu>=1.15,<1.19" in f["fix"]
    # the CUDA 11.8 build of 1.19 (recorded by the wheel itself) fits the same machine
    own = _snap("1.19.0", cuda="11.7").replace(
        "packages:", 'frameworks: {onnxruntime: {version: "1.19.0", cuda: "11.8"}}\npackages:')
    assert doctor(tmp_path, own).codes("onnxruntime") == set()


def test_cuda10_builds_need_their_minor(tmp_path: Path) -> None:
    # microsoft/onnxruntime#6379: 1.5.1 needs CUDA 10.2 + cuDNN 8; Colab had CUDA 10.1
    got = doctor(tmp_path, _snap("1.5.1", cuda="10.1"))
    [f] = got.of("cuda-mismatch", "onnxruntime")
    assert "libcudart.so.10.2" in f["message"] and "Failed to create" not in f["message"]
    assert "onnxruntime-gpu>=1.2,<1.5" in f["fix"]
    assert "pip install 'onnxruntime-gpu>=1.2,<1.5'" in got.text  # printed whole


def test_releases_the_matrix_does_not_know_are_said_not_judged(tmp_path: Path) -> None:
    got = doctor(tmp_path, _snap("1.32.0", cuda="12.8"))
    assert got.codes("onnxruntime") == set()
    assert [f["code"] for f in got.findings if f["component"] == "onnxruntime"] == ["not-judged"]
    assert "? onnxruntime" in got.text
    # its own record of the build's CUDA is still judged
    rec = _snap("1.32.0", cuda="12.8").replace(
        "packages:", 'frameworks: {onnxruntime: {version: "1.32.0", cuda: "13.0"}}\npackages:')
    assert "cuda-mismatch" in doctor(tmp_path, rec).codes("onnxruntime")


def test_detection_reads_the_builds_cuda(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes_ort", path)
    fakes = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fakes
    spec.loader.exec_module(fakes)
    fakes.make_dist(tmp_path, "onnxruntime-gpu", "1.22.0", {
        "onnxruntime/capi/build_and_package_info.py":
            "package_name = 'onnxruntime-gpu'\n__version__ = '1.22.0'\ncuda_version = '12.8'\n"})
    frameworks, packages, _, _ = probe_python(Host(site_paths=[str(tmp_path)]))
    assert frameworks["onnxruntime"] == {"version": "1.22.0", "package": "onnxruntime-gpu",
                                         "source": "metadata", "cuda": "12.8"}
    assert packages["onnxruntime-gpu"] == "1.22.0"
