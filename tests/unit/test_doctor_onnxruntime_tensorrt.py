"""ONNX Runtime's TensorRT execution provider against the TensorRT found beside it (the TensorRT
EP requirements table: one TensorRT major.minor per ONNX Runtime release), judged by the real
doctor through `doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

LINUX = "os: Linux\ndriver: {version: 570.124.06}\ngpus: [{name: NVIDIA A100-SXM4-80GB}]\n"
CUDA11 = ('cuda_runtimes: [{version: "11.8", source: "system:/usr/local/cuda"}]\n'
          'cudnn: [{version: "8.9.7", source: "system:/usr/local/cuda"}]\n')


def _snap(ort: str, trt: str | None, *, package: str = "tensorrt", os_line: str = LINUX,
          extra: str = CUDA11) -> str:
    packages = f'onnxruntime-gpu: "{ort}"'
    if trt is not None:
        packages += f", {package}: " + (f'"{trt}"' if trt else "null")
    return os_line + extra + f"packages: {{{packages}}}\n"


def _trt(d) -> list[dict]:  # noqa: ANN001 - the helpers' Doctor
    return [f for f in d.findings if f["component"] == "onnxruntime"
            and "TensorRT execution provider" in f["message"]]


def test_an_older_tensorrt_minor_fails_with_both_fixes(tmp_path: Path) -> None:
    # microsoft/onnxruntime#12766: 1.12.1 with a TensorRT before 8.4 -> 'undefined symbol'
    d = doctor(tmp_path, _snap("1.12.1", "8.2.5.1"))
    [f] = d.of("build-mismatch", "onnxruntime")
    assert d.code == 1 and f["severity"] == "error"
    assert f["evidence"] == {"tensorrt_needed": "8.4", "tensorrt_found": "8.2.5.1"}
    assert "undefined symbol" in f["message"]
    assert "libonnxruntime_providers_tensorrt.so" in f["message"]
    assert f["fix"].startswith("install TensorRT 8.4 (https://developer.nvidia.com/tensorrt) "
                               "and put its lib folder first on LD_LIBRARY_PATH")
    # the ONNX Runtime release line built with TensorRT 8.2
    assert "`pip install 'onnxruntime-gpu>=1.11,<1.12'`" in f["fix"]
    assert "pip install 'onnxruntime-gpu>=1.11,<1.12'" in d.text.split("commands")[-1]
    assert "TensorRT-ExecutionProvider.html#requirements" in f["source"]


def test_another_major_fails_and_a_newer_minor_warns(tmp_path: Path) -> None:
    d = doctor(tmp_path, _snap("1.17.3", "10.0.1", package="tensorrt-cu12"))
    [f] = d.of("build-mismatch", "onnxruntime")
    assert f["severity"] == "error" and "libnvinfer of TensorRT 8, not 10" in f["message"]
    assert "`pip install 'onnxruntime-gpu>=1.18,<1.19'`" in f["fix"]
    w = doctor(tmp_path, _snap("1.12.1", "8.5.3.1"))
    [f] = w.of("build-mismatch", "onnxruntime")
    assert w.code == 0 and f["severity"] == "warning"
    assert "`pip install 'onnxruntime-gpu>=1.14,<1.15'`" in f["fix"]
    # a TensorRT no release line is built with: only the TensorRT to install
    n = doctor(tmp_path, _snap("1.20.1", "10.1.0", extra=""))
    [f] = n.of("build-mismatch", "onnxruntime")
    assert "pip install" not in f["fix"] and "TensorRT 10.4" in f["fix"]


def test_the_tensorrt_the_release_is_built_with_passes(tmp_path: Path) -> None:
    d = doctor(tmp_path, _snap("1.12.1", "8.4.1.5"))
    assert d.code == 0 and not d.codes("onnxruntime")
    [ok] = _trt(d)
    assert ok["code"] == "ok" and "TensorRT 8.4.1.5 here" in ok["message"]
    # frameworks.tensorrt (a system TensorRT) counts as well
    s = doctor(tmp_path, LINUX + CUDA11 + 'frameworks: {tensorrt: {version: "8.6.1"}}\n'
               'packages: {onnxruntime-gpu: "1.16.3"}\n')
    assert [f["code"] for f in _trt(s)] == ["ok"]


def test_no_tensorrt_no_finding_and_an_unknown_one_a_conditional_warning(
        tmp_path: Path) -> None:
    assert _trt(doctor(tmp_path, _snap("1.12.1", None))) == []
    d = doctor(tmp_path, _snap("1.12.1", ""))
    [f] = _trt(d)
    assert f["code"] == "not-judged" and f["severity"] == "warning"
    assert "unless it is TensorRT 8.4" in f["message"]
    assert f["evidence"] == {"tensorrt_needed": "8.4"}
    assert 'python -c "import tensorrt; print(tensorrt.__version__)"' in d.text
    # an ONNX Runtime release beyond the table, or of unknown version: not this rule's to say
    assert _trt(doctor(tmp_path, _snap("1.99.0", "10.9.0"))) == []
    assert _trt(doctor(tmp_path, _snap("", "10.9.0"))) == []


def test_the_c_release_archive_and_windows(tmp_path: Path) -> None:
    # the GPU release archive recorded under frameworks: its fix names the archive, not pip
    d = doctor(tmp_path, LINUX + 'frameworks: {onnxruntime: {version: "1.12.1", package: '
               '"onnxruntime-linux-x64-gpu-1.12.1"}, tensorrt: {version: "8.6.1"}}\n')
    [f] = d.of("build-mismatch", "onnxruntime")
    assert "ONNX Runtime >=1.15,<1.18's GPU release package" in f["fix"]
    assert "pip install" not in f["fix"]
    w = doctor(tmp_path, _snap("1.12.1", "8.2.5.1", os_line="os: Windows\n"))
    [f] = w.of("build-mismatch", "onnxruntime")
    assert "onnxruntime_providers_tensorrt.dll" in f["message"]
    assert "first on PATH" in f["fix"]
