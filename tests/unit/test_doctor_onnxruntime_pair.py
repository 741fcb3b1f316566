"""The CPU and GPU onnxruntime packages installed together are an error (ONNX Runtime's Python
install page: only one package at a time), with commands that leave only the GPU one."""

from __future__ import annotations

from _doctor_helpers import doctor

ORT = """gpus: [{name: Tesla T4}]
cuda_runtimes: [{version: "12.4", source: system}]
cudnn: [{version: "9.1"}]
packages: {onnxruntime: "1.19.0", onnxruntime-gpu: "1.19.0"}
"""


def test_cpu_and_gpu_onnxruntime_together_is_an_error_with_commands(tmp_path) -> None:
    d = doctor(tmp_path, ORT)
    err = d.of("duplicate-package", "packages")
    assert len(err) == 1 and err[0]["severity"] == "error"
    assert "onnxruntime and onnxruntime-gpu are installed together" in err[0]["message"]
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in d.text
    assert "pip install onnxruntime-gpu==1.19.0" in d.text
    assert "onnxruntime.ai/docs/get-started/with-python.html" in err[0]["source"]
    assert d.data["verdict"] == "fail"


def test_one_onnxruntime_package_alone_is_not_a_conflict(tmp_path) -> None:
    for pkg in ("onnxruntime-gpu", "onnxruntime"):
        text = ORT.replace('onnxruntime: "1.19.0", onnxruntime-gpu: "1.19.0"', f'{pkg}: "1.19.0"')
        assert not doctor(tmp_path, text).of("duplicate-package")
