"""What the operating system decides before any version is compared.

- TensorFlow 2.10 was the last release with GPU support on native Windows: from 2.11 the
  Windows wheels are CPU-only (GPU through WSL2, which is Linux to doctor).
- The torch wheels on PyPI are CUDA builds on Linux only; on Windows and macOS a torch with
  no ``+cuXXX`` tag from PyPI is CPU-only (CUDA builds come from download.pytorch.org).
- A CPU-only build (torch ``+cpu``, ``tensorflow-cpu``, ``is_built_with_cuda()`` False) never
  uses the GPU, so its arch list, CUDA and cuDNN are not judged.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

TF_WINDOWS_LAST_GPU = Version.parse("2.10")
TF_WINDOWS_SOURCE = (
    "https://github.com/tensorflow/tensorflow/releases/tag/v2.11.1 ('TensorFlow 2.10 was the "
    "last TensorFlow release that supported GPU on native-Windows. Starting with TensorFlow "
    "2.11, you will need to install TensorFlow in WSL2, or install tensorflow-cpu'); "
    "https://www.tensorflow.org/install/pip (Windows native)")
TORCH_PYPI_SOURCE = (
    "https://docs.astral.sh/uv/guides/integration/pytorch/ (PyPI hosts CPU-only torch wheels "
    "for Windows and macOS, CUDA wheels for Linux); opendatalab/MinerU#240 "
    "(torch-2.3.1-cp310-cp310-win_amd64.whl from PyPI: 'Torch not compiled with CUDA enabled')")
OS_NAMES = {"windows": "Windows", "macos": "macOS"}


def cpu_only(ctx: Context, component: str, what: str, *, why: str = "", fix: str | None = None,
             source: str | None = None, **evidence: Any) -> list[Finding]:
    """A build with no CUDA code: a warning when a GPU or driver is here, else a note."""
    if ctx.gpus or ctx.driver_present:
        return [finding("cuda-mismatch", "warning", component, f"{what} is a CPU-only build"
                        f"{why}: it will not use the NVIDIA GPU", fix=fix, source=source,
                        build="cpu", **evidence)]
    return [finding("ok", "info", component, f"{what} is a CPU-only build{why}: it cannot use "
                    "an NVIDIA GPU", fix=fix, source=source, build="cpu", **evidence)]


def tensorflow_windows(ctx: Context, what: str, version: Version | None,
                       last_gpu: Row | None) -> list[Finding]:
    """TensorFlow >= 2.11 on native Windows: no GPU build exists."""
    if ctx.os_kind != "windows" or version is None or \
            version.trunc(2) <= TF_WINDOWS_LAST_GPU:
        return []
    old = ""
    if last_gpu is not None:
        old = (f"; or, for the GPU on native Windows, `pip install \"tensorflow=="
               f"{last_gpu['tensorflow']}.*\"` with CUDA {last_gpu['cuda']} and cuDNN "
               f"{last_gpu['cudnn']}" + (f" (Python {last_gpu['python']})"
                                         if last_gpu.get("python") else ""))
    return [finding(
        "cuda-mismatch", "error", "tensorflow",
        f"{what} has no GPU support on native Windows: TensorFlow "
        f"{TF_WINDOWS_LAST_GPU} was the last release with it, later ones run on the CPU only",
        fix="run TensorFlow in WSL2 and there `pip install \"tensorflow[and-cuda]\"`" + old,
        source=TF_WINDOWS_SOURCE, os="windows", last_gpu_release=str(TF_WINDOWS_LAST_GPU))]


def torch_pypi(ctx: Context, what: str, default: Row | None, fix: str | None) -> list[Finding]:
    """A torch with no CUDA tag on Windows / macOS: PyPI's wheel there is CPU-only."""
    kind = ctx.os_kind
    if kind not in OS_NAMES:
        return []
    if kind == "macos":
        fix = "PyPI's macOS torch wheels have no CUDA: use a Linux or Windows host for the GPU"
    elif fix is None and default is not None:
        fix = (f"pip install \"torch=={default['torch']}.*\" --index-url "
               f"https://download.pytorch.org/whl/{default['variant']}")
    return cpu_only(ctx, "torch", what, why=f" (PyPI's {OS_NAMES[kind]} wheels carry no CUDA; "
                    "CUDA builds come from download.pytorch.org with a +cuXXX tag)", fix=fix,
                    source=TORCH_PYPI_SOURCE, os=kind)
