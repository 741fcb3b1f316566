"""onnxruntime-gpu whose cuDNN major is not the one here, with no CUDA runtime listed: the fix
offers the release line built for the cuDNN found (ORT's CUDA EP requirements table), before
the libraries of the installed one."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor


def test_cudnn9_here_offers_the_cuda12_cudnn9_pypi_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'cudnn:\n  - {version: "9"}\npackages: {onnxruntime-gpu: "1.18"}\n')
    [f] = d.of("cudnn-mismatch", "onnxruntime")
    assert f["fix"].startswith("`pip install 'onnxruntime-gpu>=1.19,<1.21'` (the PyPI build "
                               "for CUDA 12.x, cuDNN 9)")
    assert "install CUDA 11.x and cuDNN 8" in f["fix"]  # still offered, second
    commands = d.text.split("commands (one per line):")[1]
    assert commands.index("onnxruntime-gpu>=1.19") < commands.index("nvidia-cudnn-cu11")


def test_cudnn8_here_with_a_cudnn9_build_offers_a_cudnn8_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'cudnn:\n  - {version: "8.9.7"}\npackages: {onnxruntime-gpu: "1.20.1"}\n')
    [f] = d.of("cudnn-mismatch", "onnxruntime")
    first, second = f["fix"].split("; or ")[:2]
    assert "CUDA 11.x, cuDNN 8 of onnxruntime-gpu >=1.19,<1.21" in first  # ORT's own feed
    assert second.startswith("`pip install 'onnxruntime-gpu>=1.15,<1.19'`")  # PyPI, cuDNN 8
