"""Building CUDA extensions against torch (xformers, flash-attn, apex, a project's own ops).

torch's extension builder (torch.utils.cpp_extension) compiles with the toolkit it finds
(``CUDA_HOME`` / ``CUDA_PATH``, else the ``nvcc`` on ``PATH``, else /usr/local/cuda) and
compares that nvcc's CUDA with the CUDA torch was built with: a different major raises
"The detected CUDA version (X) mismatches the version that was used to compile PyTorch (Y)",
a different minor only warns. Prebuilt wheels are not affected: this matters when something is
built here, so it is a warning (a minor difference an info).
"""

from __future__ import annotations

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.stack import torch_stack

CPP_EXTENSION_SOURCE = (
    "torch/utils/cpp_extension.py _check_cuda_version ('if cuda_ver.major != "
    "torch_cuda_version.major: raise RuntimeError(CUDA_MISMATCH_MESSAGE ...)', otherwise "
    "logger.warning(CUDA_MISMATCH_WARN): 'has a minor version mismatch ... Most likely this "
    "shouldn't be a problem') and _find_cuda_home (CUDA_HOME / CUDA_PATH, then nvcc on PATH, "
    "then /usr/local/cuda), read in the torch 2.13 wheel; danthe3rd in "
    "facebookresearch/xformers#748 (nvcc 12.1 with torch 2.0.0+cu118: 'You'll need to use nvcc "
    "version 11.8. However we provide (already pre-compiled) binaries')")

APEX_SOURCE = (
    "NVIDIA/apex#323 (merged 2019-05, 'Hard error on mismatch between torch.version.cuda and the "
    "Cuda toolkit version being used to compile Apex': setup.py "
    "check_cuda_torch_binary_vs_bare_metal raises when bare_metal_major != torch_binary_major "
    "or bare_metal_minor != torch_binary_minor); the check still raised in 2023-12 "
    "(NVIDIA/apex#1761: torch 2.1.2+cu121, nvcc 11.5); option PRs to skip it closed (#967, #997: 'these "
    "version mismatches are not tested internally')")

def toolkits(ctx: Context) -> list[tuple[Component, Version]]:
    """CUDA toolkits with an nvcc: toolkit folders (``system:<dir>``) and nvcc on PATH; not the
    libcudart copies of the ld cache, pip's runtime wheels or conda's cudart."""
    out = []
    for rt in ctx.env.cuda_runtimes:
        src = rt.source or ""
        if not (src.startswith("nvcc:") or (src.startswith("system:")
                                            and not src.startswith("system:ldconfig"))):
            continue
        if "compat" in f"{src} {rt.path or ''}".lower():
            continue
        v = Version.maybe(rt.version)
        if v is not None:
            out.append((rt, v))
    return out


def check(ctx: Context) -> list[Finding]:
    """The toolkits here against the CUDA torch was built with."""
    torch_cuda, _ = torch_stack(ctx)
    found = toolkits(ctx)
    if torch_cuda is None or not found:
        return []
    same = [(c, v) for c, v in found if v.major == torch_cuda.major]
    other = [(c, v) for c, v in found if v.major != torch_cuda.major]
    where = ", ".join(f"{v} ({c.source})" for c, v in other)
    if other and not same:
        cuda = other[0][1]
        return [finding(
            "cuda-mismatch", "warning", "cuda",
            f"the CUDA toolkit here, {where}, has another major than torch's CUDA "
            f"{torch_cuda}: building a CUDA extension against this torch (xformers, "
            "flash-attn, apex, a project's own ops) fails with 'The detected CUDA version "
            f"({cuda.trunc(2)}) mismatches the version that was used to compile PyTorch "
            f"({torch_cuda.trunc(2)})'; prebuilt wheels are not affected",
            fix=f"install the CUDA {torch_cuda.trunc(2)} toolkit and point CUDA_HOME at it, "
            f"or install a torch built for CUDA {cuda.major}.x, or use the extension's "
            "prebuilt wheel", source=CPP_EXTENSION_SOURCE, toolkit=str(cuda),
            torch_cuda=str(torch_cuda))]
    if other:  # both majors installed: which one is used depends on CUDA_HOME / PATH
        return [finding(
            "cuda-mismatch", "info", "cuda",
            f"CUDA toolkits of two majors are installed ({where}; and "
            + ", ".join(f"{v} ({c.source})" for c, v in same) + f"): extensions built "
            f"against torch (CUDA {torch_cuda}) must use the CUDA {torch_cuda.major}.x one "
            "(CUDA_HOME, else the nvcc on PATH)", source=CPP_EXTENSION_SOURCE,
            torch_cuda=str(torch_cuda))]
    minor = [(c, v) for c, v in same if v.trunc(2) != torch_cuda.trunc(2)]
    if minor and len(minor) == len(same):
        c, v = minor[0]
        names = {canonical_name(n) for n in (ctx.env.packages or {})}
        if "apex" in names:  # apex's own setup.py check is stricter than torch's
            return [finding(
                "cuda-mismatch", "warning", "apex",
                f"the CUDA {v} toolkit ({c.source}) differs from torch's CUDA {torch_cuda} in "
                "the minor, and apex's setup.py (--cuda_ext) requires the same major.minor: "
                "'Cuda extensions are being compiled with a version of Cuda that does not "
                "match the version used to compile Pytorch binaries'",
                fix=f"install the CUDA {torch_cuda.trunc(2)} toolkit and point CUDA_HOME at "
                f"it, or a torch built for CUDA {v.trunc(2)}", source=APEX_SOURCE,
                toolkit=str(v), torch_cuda=str(torch_cuda))]
        return [finding(
            "cuda-mismatch", "info", "cuda",
            f"the CUDA {v} toolkit ({c.source}) differs from torch's CUDA {torch_cuda} in the "
            "minor only: extensions build, with torch's warning 'has a minor version mismatch "
            "... Most likely this shouldn't be a problem'", source=CPP_EXTENSION_SOURCE,
            toolkit=str(v), torch_cuda=str(torch_cuda))]
    return []
