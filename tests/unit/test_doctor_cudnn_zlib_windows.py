"""cuDNN 8.3-8.9 on Windows loads zlibwapi.dll, which nothing installs with it: a conditional
warning naming the DLL and NVIDIA's install step (cuDNN 9 does not need it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

TOOLKIT = ("cuda_runtimes: [{version: '11.8', source: 'system:C:\\Program Files\\NVIDIA GPU "
           "Computing Toolkit\\CUDA\\v11.8'}]\n")


def _cudnn(version: str, source: str) -> str:
    return f"cudnn: [{{version: '{version}', source: '{source}'}}]\n"


def test_cudnn_8_6_archive_on_windows_warns_with_the_zlib_step(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Windows\ngpus: [{name: NVIDIA GeForce GTX 1660 SUPER}]\n"
               + TOOLKIT + _cudnn("8.6.0.163", "archive:cudnn-windows-x86_64-8.6.0.163"))
    [f] = d.of("dll-dependency", "cudnn")
    assert f["severity"] == "warning" and d.data["verdict"] == "warn"
    assert "zlibwapi.dll" in f["message"] and "not in the snapshot" in f["message"]
    assert "zlib123dllx64.zip" in f["fix"] and "zlibwapi.dll" in f["fix"]
    assert "CUDA\\v11.8\\bin" in f["fix"] and "cuDNN 9" in f["fix"]
    assert "cupy/cupy#6226" in f["source"] and "compat/libraries.yaml" in f["source"]
    assert "✓ cudnn" not in d.text


@pytest.mark.parametrize("snapshot", [
    "os: Windows\n" + _cudnn("8.2.1", "system:C:/CUDA/v11.3/bin"),          # before 8.3
    "os: Windows\n" + _cudnn("9.1.0", "system:C:/CUDA/v12.4/bin"),          # cuDNN 9
    "os: Windows\n" + _cudnn("8.9.7", "torch:bundled"),                     # torch ships it
    "os: Windows\n" + _cudnn("8.8.0", "conda:C:/envs/x"),                   # conda's depends
    "os: Ubuntu 22.04\n" + _cudnn("8.6.0", "system:ldconfig"),               # Linux: zlib1g
    _cudnn("8.6.0", "system:C:/CUDA/v11.8/bin"),                             # OS not given
])
def test_no_warning_where_the_dll_is_not_needed_or_comes_with_it(tmp_path: Path,
                                                                 snapshot: str) -> None:
    assert not doctor(tmp_path, snapshot).of("dll-dependency")
