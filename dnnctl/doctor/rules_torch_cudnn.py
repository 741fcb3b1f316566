"""torch and an explicit ``cudnn: []``: when the empty list overrides the wheel's own cuDNN.

The matrix row says which cuDNN a torch *wheel* brings (its ``nvidia-cudnn-cuN`` dependency,
or a copy in torch/lib), and that assumption stands while the snapshot says nothing about
cuDNN. An explicit ``cudnn: []`` (looked, found none) overrides it only where it can speak
for torch's copy (``stack.torch_cudnn_missing``):

- a conda or custom build (a source build, NGC's or JetPack's ``2.x.0a0+<sha>``) brings no
  cuDNN: it links the one the loader finds (conda-forge's pytorch runs on its ``cudnn``
  package), so none here means ``import torch`` fails;
- a PyPI wheel whose cuDNN is its pip dependency fails the same way where the snapshot lists
  the packages and ``nvidia-cudnn-cuN`` is not among them (installed with ``--no-deps``);
- for any other wheel the list may cover only system copies (a report's "cuDNN version:
  Could not collect"), so the wheel's copy is still assumed, and the doctor says so.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.versions import Version, parse_cudnn
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import torch_cudnn_missing, torch_cudnn_origin

SYSTEM_SOURCE = (
    "conda-forge/pytorch-cpu-feedstock recipe/meta.yaml (the CUDA build's host and run "
    "requirement `cudnn`: it links conda's cuDNN, it bundles none); pytorch/pytorch README.md, "
    "'From Source' (install NVIDIA cuDNN to build with it: the build links the cuDNN found "
    "then)")
PIP_SOURCE = (
    "the torch wheel's Requires-Dist (pip log in triton-lang/triton#1057: "
    "torch-2.0.0-...-manylinux1_x86_64.whl, 'Collecting nvidia-cudnn-cu11==8.5.0.96 ... "
    "(from torch)'); pytorch/pytorch#119989 (the wheel loads libcudnn from the nvidia-cudnn "
    "package)")


def check(ctx: Context, info: dict[str, Any], what: str, compiled: Version,
          cuda: Version, release_fix: str | None) -> list[Finding] | None:
    """Findings that replace the usual cuDNN check when the snapshot lists none, else None.
    ``compiled``: the cuDNN the build was compiled with (the wheel's, or its own report);
    ``release_fix``: a release wheel to install instead (it brings its own cuDNN)."""
    if not ctx.env.none_found("cudnn"):
        return None
    origin = torch_cudnn_origin(ctx)
    if torch_cudnn_missing(ctx):
        if origin == "system":
            return [_system(ctx, info, what, compiled, cuda, release_fix)]
        return [_pip_dependency(info, what, compiled, cuda)]
    names = set(ctx.packages)
    if origin not in ("pip", "wheel") or any(n.startswith("nvidia-cudnn") for n in names) \
            or info.get("cudnn_runtime") or info.get("cudnn_loaded"):
        return None
    where = (f"its pip dependency {_package(info, cuda)} {_pin(info, compiled)}"
             if origin == "pip" else "in torch/lib or as a pip dependency")
    return [finding(
        "not-judged", "info", "cudnn",
        f"{what}: the snapshot lists no cuDNN (cudnn: []), but this wheel brings its own "
        f"cuDNN {compiled.major} ({where}), which a list of system copies does not show; "
        "assumed present, not judged", source=PIP_SOURCE, cudnn_assumed=compiled)]


def _package(info: dict[str, Any], cuda: Version) -> str:
    return str(info.get("cudnn_package") or f"nvidia-cudnn-cu{cuda.major}")


def _pin(info: dict[str, Any], compiled: Version) -> str:
    return str(parse_cudnn(info.get("cudnn")) or compiled)


def _pip_dependency(info: dict[str, Any], what: str, compiled: Version,
                    cuda: Version) -> Finding:
    package, pin = _package(info, cuda), _pin(info, compiled)
    return finding(
        "cudnn-mismatch", "error", "cudnn",
        f"{what} is a PyPI wheel whose cuDNN is its pip dependency {package} ({pin}); the "
        "packages listed here lack it and no other cuDNN is installed, so `import torch` "
        f"fails with 'libcudnn.so.{compiled.major}: cannot open shared object file' (a torch "
        "installed with --no-deps)", fix=f"pip install '{package}=={pin}'", source=PIP_SOURCE,
        cudnn_needed=pin, cudnn_found=[])


def _system(ctx: Context, info: dict[str, Any], what: str, compiled: Version,
            cuda: Version, release_fix: str | None) -> Finding:
    conda = str(info.get("installer") or "").strip().lower() == "conda"
    own = parse_cudnn(info.get("cudnn_compiled")) or parse_cudnn(info.get("cudnn"))
    built = f" (built against cuDNN {own})" if own else ""
    kind = "a conda build" if conda else "a custom build (not a release wheel)"
    need = f"cuDNN {(own or compiled).major}.x for CUDA {cuda.major}.x"
    var = "PATH" if ctx.os_kind == "windows" else "LD_LIBRARY_PATH"
    fix = (f"`conda install 'cudnn={(own or compiled).major}.*'` in this environment" if conda
           else f"install {need} where the loader finds it (the system package, or a "
           f"directory on {var})")
    if release_fix and not conda:
        fix += f", or use a release wheel, which brings its own: {release_fix}"
    return finding(
        "cudnn-mismatch", "error" if conda or own else "warning", "cudnn",
        f"torch {info.get('version') or what} is {kind}{built}: it brings no cuDNN of its own and loads the one the "
        "loader finds, and no cuDNN is installed here: `import torch` fails with "
        f"'libcudnn.so.{(own or compiled).major}: cannot open shared object file'"
        + ("" if conda or own else " (unless it was built without cuDNN, which leaves "
           "torch.backends.cudnn unavailable)"),
        fix=fix, source=SYSTEM_SOURCE, build="conda" if conda else "custom",
        cudnn_found=[])
