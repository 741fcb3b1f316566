"""A TensorFlow CUDA build whose CUDA runtime is not installed, judged without a release row.

TensorFlow dlopens the CUDA runtime of the major it was built for (``libcudart.so.11.0`` for
every CUDA 11 build, ``libcudart.so.12`` for CUDA 12) from the ld cache and LD_LIBRARY_PATH and
runs on the CPU only when none is found ("Could not load dynamic library 'libcudart.so.11.0'").
With a release row rules_frameworks judges this among the release's libraries; this rule
covers a build known only by its CUDA (version unknown, or a release without a certain row),
and only where the snapshot says it looked: an explicit ``cuda_runtimes: []`` (none found) or
runtimes of other majors, never an absent list (unknown).
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import library_major

SOURCE = (
    "maintainer in rstrivedi/Melting-Pot-Contest-2023#6 (TensorFlow in WSL2: 'Could not load "
    "dynamic library 'libcudart.so.11.0'': install the CUDA toolkit and cuDNN in the conda "
    "env and put the directory holding libcudart.so.11.0 on LD_LIBRARY_PATH; the reporter: "
    "'Your solution has resolved my issue'); tensorflow/docs site/en/install/pip.md @06798ba "
    "(TensorFlow < 2.11 with a GPU: 'conda install -c conda-forge cudatoolkit=11.2 "
    "cudnn=8.1.0'; from 2.14 on Linux: pip install tensorflow[and-cuda]); "
    "https://www.tensorflow.org/install/source#gpu (CUDA 11.2 / cuDNN 8.1 for 2.5-2.11, "
    "CUDA 11.8 / cuDNN 8.6 for 2.12-2.13)")


def _info(ctx: Context) -> dict[str, Any] | None:
    """The TensorFlow entry, or none when only packages list it (its CUDA is then unknown)."""
    info = (ctx.env.frameworks or {}).get("tensorflow")
    return info if isinstance(info, dict) else None


def check(ctx: Context) -> list[Finding]:
    """A TF CUDA build with no release row, against the CUDA runtimes the snapshot found."""
    info = _info(ctx)
    if info is None or info.get("cuda_build") is False or ctx.os_kind == "windows":
        return []  # native Windows loads cudart64_*.dll: another rule's names
    cuda = Version.maybe(info.get("cuda"))
    if cuda is None or cuda.major == 0:
        return []
    version = str(info.get("version") or "")
    ver = Version.maybe(version)
    row = ctx.matrix.tensorflow_row(ver) if ver is not None else None
    if row is not None and not row.uncertain:
        return []  # judged with its release's libraries (rules_frameworks)
    what = f"tensorflow {version}" if version else "tensorflow (version unknown)"
    found = library_major(ctx, "tensorflow", what, cuda.major, "libcudart",
                          fix=_fix(cuda, version),
                          built=None if cuda.major_only else cuda)
    for f in found:
        f.source = SOURCE
    return found


def _fix(cuda: Version, version: str) -> str:
    """The CUDA runtime (and cuDNN) of the build's major, where TensorFlow looks for it."""
    path = "`export LD_LIBRARY_PATH=$CONDA_PREFIX/lib:$LD_LIBRARY_PATH`"
    if cuda.major == 11:
        return ("install the CUDA 11 runtime and cuDNN 8 into the env: `conda install -c "
                "conda-forge cudatoolkit=11.2 cudnn=8.1.0` (TensorFlow 2.5-2.11; 2.12-2.13: "
                f"CUDA 11.8 and cuDNN 8.6) in a conda env, then {path}")
    if cuda.major >= 12:
        pin = f"=={version}" if version else ""
        return (f"`pip install \"tensorflow[and-cuda]{pin}\"` (it installs the CUDA "
                f"{cuda.major} libraries as pip packages)"
                + ("" if version else " at the TensorFlow version installed"))
    release = f"{cuda.major}.{cuda.minor}" if not cuda.major_only else f"{cuda.major}.x"
    return (f"install the CUDA {release} runtime libraries and the cuDNN of this TensorFlow "
            "release where the loader finds them (the ld cache or LD_LIBRARY_PATH)")
