"""On native Windows DLLs are found through PATH, not LD_LIBRARY_PATH, and TensorFlow 2.10
bundles no cuDNN: the fix installs the tested cuDNN (tensorflow.org/install/source_windows)."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

TF210 = "frameworks: {tensorflow: {version: '2.10.0'}}\n"
OLD = ('cudnn: [{version: "8.0.5", source: "system:C:/CUDA/v11.2/bin", '
       'path: "C:/CUDA/v11.2/bin/cudnn64_8.dll", loaded_first: true}]\n')


def test_windows_fix_names_path_and_the_tested_cudnn(tmp_path: Path) -> None:
    got = doctor(tmp_path, "os: Windows 10\n" + OLD + TF210)
    [f] = got.of("cudnn-shadowed")
    assert "PATH" in f["fix"] and "LD_LIBRARY_PATH" not in f["fix"]
    assert "install cuDNN 8.1 for CUDA 11.x" in f["fix"] and "bundled" not in f["fix"]


def test_linux_with_a_bundled_copy_keeps_its_fix(tmp_path: Path) -> None:
    pip = ('  - {version: "8.6.0.163", source: "pip:nvidia-cudnn-cu11"}\n')
    snap = ("os: Linux\ncudnn:\n  - {version: '8.1.0', source: 'env:LD_LIBRARY_PATH', path: "
            "/opt/conda/lib/libcudnn.so.8, loaded_first: true}\n" + pip
            + "frameworks: {tensorflow: {version: '2.13.0'}}\n")
    [f] = doctor(tmp_path, snap).of("cudnn-shadowed")
    assert "from LD_LIBRARY_PATH" in f["fix"] and "bundled copy loads" in f["fix"]
