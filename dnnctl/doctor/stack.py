"""What a torch in the environment brings: the CUDA and cuDNN of its build.

Its own fields win (``cuda`` from torch/version.py, the cuDNN it pins or reports); otherwise
the matrix row of its wheel (the ``+cuXYZ`` tag, or PyPI's default variant on Linux). Other
rules compare add-ons with it (onnxruntime-gpu reuses torch's CUDA and cuDNN; an extension
built here must use torch's CUDA major).

Only a wheel brings its own cuDNN (``torch_cudnn_origin``): a conda or custom build (a
source build, NGC's or JetPack's ``2.x.0a0+<sha>``) loads whichever cuDNN the loader finds,
so an explicit ``cudnn: []`` (looked, found none) overrides the wheel's assumed copy for it
(``torch_cudnn_missing``); for a PyPI wheel it does where the snapshot lists the packages and
the wheel's ``nvidia-cudnn-cuN`` dependency is not among them.
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import TorchVersion, Version, parse_cudnn, tag_from_cuda
from dnnctl.doctor.context import Context
from dnnctl.errors import UsageError

# PyPI's Linux torch wheels depend on nvidia-cudnn-cuN (pip log quoted in triton-lang/triton#1057:
# torch-2.0.0-cp38-cp38-manylinux1_x86_64.whl, "Collecting nvidia-cudnn-cu11==8.5.0.96 ... (from
# torch)"); detection reads the pin itself (frameworks.torch.cudnn_package).
PIP_CUDNN_FROM = Version.parse("2.0")


def torch_info(ctx: Context, packages: bool = False) -> dict | None:
    """The torch entry; with ``packages``, one made from ``packages`` when only that lists
    torch (the stack other rules compare with keeps to the entry)."""
    info = (ctx.env.frameworks or {}).get("torch")
    if info is not None or not packages:
        return info
    packages = ctx.packages
    if "torch" not in packages:
        return None
    return {"version": packages["torch"]} if packages["torch"] else {}


def torch_version(ctx: Context) -> tuple[TorchVersion, dict] | None:
    """The version of the CUDA torch here (its entry, else its package) with that entry;
    None for a CPU-only build, no version, or one that cannot be read."""
    info = torch_info(ctx, packages=True) or {}
    text = str(info.get("version") or "")
    if not text or info.get("cuda_build") is False:
        return None
    try:
        return TorchVersion.parse(text), info
    except UsageError:
        return None


def torch_variant(ctx: Context, info: dict, ver: TorchVersion) -> str | None:
    """The wheel variant (cuXYZ / cpu / another local tag) of the torch here: its local tag,
    ``cpu`` for a build without CUDA, else the CUDA its entry gives (``cuda: 11.1`` -> cu111),
    else PyPI's default variant of its line on Linux; None where none of them says."""
    tag = str(info.get("local_tag") or "").lower() or ver.local
    if tag:
        return tag
    if info.get("cuda_build") is False:
        return "cpu"
    cuda = Version.maybe(str(info.get("cuda") or ""))
    if cuda is not None:
        return tag_from_cuda(cuda)
    row = next((r for r in ctx.matrix.torch_rows(ver.line) if r.get("pypi_default")), None)
    return row["variant"] if row is not None and ctx.os_kind in (None, "linux") else None


def torch_row(ctx: Context, packages: bool = False) -> Row | None:
    """The matrix row of the torch wheel here (its +cuXYZ tag, or PyPI's default variant on
    Linux); None for a CPU / ROCm build, an unknown version or a wheel the matrix lacks. With
    ``packages``, a torch listed only in ``packages`` counts too (torch_info)."""
    info = torch_info(ctx, packages) or {}
    if info.get("cuda_build") is False or not info.get("version"):
        return None
    try:
        ver = TorchVersion.parse(info["version"])
    except UsageError:
        return None
    local = (info.get("local_tag") or ver.local or "").lower()
    if local:
        return ctx.matrix.torch_row(ver.line, local) if local.startswith("cu") else None
    if ctx.os_kind in (None, "linux"):  # PyPI's Linux wheel is the default CUDA variant
        return next((r for r in ctx.matrix.torch_rows(ver.line) if r.get("pypi_default")), None)
    return None


def torch_stack(ctx: Context, packages: bool = False) -> tuple[Version | None, Version | None]:
    """(CUDA, cuDNN) of the torch build here; (None, None) for a CPU / ROCm build or none.
    With ``packages``, a torch listed only in ``packages`` counts too (torch_info)."""
    info = torch_info(ctx, packages) or {}
    if info.get("cuda_build") is False:
        return None, None
    if not info.get("version"):
        return Version.maybe(info.get("cuda")), parse_cudnn(info.get("cudnn"))
    local = str(info.get("local_tag") or "").lower() or \
        (str(info["version"]).split("+", 1)[1].lower() if "+" in str(info["version"]) else "")
    if local and TorchVersion(Version.parse("0"), local, "").custom:  # what it reports
        return Version.maybe(info.get("cuda")), (parse_cudnn(info.get("cudnn_runtime"))
                                                 or parse_cudnn(info.get("cudnn")))
    if local and not local.startswith("cu"):
        return None, None  # a CPU or ROCm build brings no CUDA
    row = torch_row(ctx, packages)
    cuda = Version.maybe(info.get("cuda")) or (Version.maybe(row["cuda"]) if row else None)
    cudnn = (parse_cudnn(info.get("cudnn_runtime")) or parse_cudnn(info.get("cudnn"))
             or (parse_cudnn(row.get("cudnn")) if row else None))
    if torch_cudnn_missing(ctx, packages):
        cudnn = None  # it would load one from the system, and the snapshot found none
    return cuda, cudnn


# The C++ ABI of PyTorch's Linux wheels: pre-C++11 (_GLIBCXX_USE_CXX11_ABI=0) until 2.6, whose
# CUDA 12.6 wheels switched, and C++11 from 2.7 on. Extensions built against one (flash-attn's
# cxx11abiTRUE / FALSE wheels) fail to import against the other.
CXX11_ABI_SOURCE = (
    "malfet in pytorch/pytorch#143962 ('we should not have torch-cpu build with C++11 ABI in "
    "2.6 yet (only cuda-12.6 binaries should be like that)'; albanD: 'we do expect 2.7 to be "
    "cxx11 ABI by default'); Dao-AILab/flash-attention#1644 ('PyTorch updated its C++ ABI in "
    "2.6.0cu126, and it stayed this way in 2.7.0cu128'); pytorch/pytorch#72907 (the pip "
    "wheels: torch._C._GLIBCXX_USE_CXX11_ABI False)")
CXX11_ABI_FROM = Version.parse("2.7")


def torch_cxx11_abi(ctx: Context, info: dict | None = None) -> bool | None:
    """torch._C._GLIBCXX_USE_CXX11_ABI of the torch here (``info``, else its entry or its
    package): its own report, else what its wheel was built with; None for a conda or custom
    build, or no torch."""
    info = info if info is not None else torch_info(ctx, packages=True) or {}
    if isinstance(info.get("cxx11_abi"), bool):
        return info["cxx11_abi"]
    text = str(info.get("version") or "")
    try:
        ver = TorchVersion.parse(text)
    except UsageError:
        return None
    local = (str(info.get("local_tag") or "") or ver.local or "").lower()
    if str(info.get("installer") or "").lower() == "conda" or (
            local and not re.fullmatch(r"cu\d+|cpu", local)):
        return None
    line = ver.release.trunc(2)
    if line >= CXX11_ABI_FROM:
        return True
    if line == Version.parse("2.6"):
        default = next((r["variant"] for r in ctx.matrix.torch_rows("2.6")
                        if r.get("pypi_default")), "")
        return (local or default) == "cu126"
    return False


def torch_cudnn_origin(ctx: Context, packages: bool = False) -> str | None:
    """Where the CUDA torch here gets its cuDNN: "pip" (a wheel whose cuDNN is its
    ``nvidia-cudnn-cuN`` dependency), "wheel" (a ``+cuXYZ`` wheel: its own copy, in torch/lib or
    as a pip dependency), "system" (a conda or custom build: the cuDNN the loader finds), or
    None (no CUDA torch, or nothing known)."""
    info = torch_info(ctx, packages)
    if info is None or info.get("cuda_build") is False:
        return None
    text = str(info.get("version") or "")
    local = str(info.get("local_tag") or (text.split("+", 1)[1] if "+" in text else "")).lower()
    if local in ("cpu",) or local.startswith(("rocm", "xpu")) or info.get("hip"):
        return None
    if str(info.get("installer") or "").strip().lower() == "conda":
        return "system"
    if local and not re.fullmatch(r"cu\d+", local):
        return "system"  # 2.3.0a0+git1a2b3c, 2.1.0a0+41361538.nv23.06: built here, not a wheel
    if info.get("cudnn_package"):
        return "pip"
    try:
        line = TorchVersion.parse(text).release.trunc(2) if text else None
    except UsageError:
        line = None
    if not local and line is not None and line >= PIP_CUDNN_FROM \
            and ctx.os_kind in (None, "linux"):
        return "pip"
    return "wheel" if line is not None else None


def torch_cudnn_missing(ctx: Context, packages: bool = False) -> bool:
    """The snapshot says no cuDNN is installed (``cudnn: []``), nothing else brings one (an
    ``nvidia-cudnn`` package, a version torch reports), and torch's own copy cannot be assumed:
    a conda / custom build, or a PyPI wheel whose listed packages lack its cuDNN dependency."""
    if not ctx.env.none_found("cudnn"):
        return False
    info = torch_info(ctx, packages) or {}
    if info.get("cudnn_runtime") or info.get("cudnn_loaded"):
        return False
    names = set(ctx.packages)
    if any(n.startswith("nvidia-cudnn") for n in names):
        return False
    origin = torch_cudnn_origin(ctx, packages)
    return origin == "system" or (origin == "pip" and bool(names))


def cudnn_majors(ctx: Context, packages: dict[str, str], torch_package: bool = False
                 ) -> set[int]:
    """cuDNN majors installed: the copies found, the nvidia-cudnn wheels (``packages``), and
    torch's own (torch_stack; with ``torch_package``, also a torch listed only in packages)."""
    texts = [c.version for c in ctx.env.cudnn]
    texts += [v for n, v in packages.items() if n.startswith("nvidia-cudnn-cu")]
    majors = {v.major for t in texts if (v := parse_cudnn(t)) is not None}
    _, torch_cudnn = torch_stack(ctx, torch_package)
    if torch_cudnn is not None:
        majors.add(torch_cudnn.major)
    return majors


def cudnn_found(ctx: Context, packages: dict[str, str], torch_package: bool = False
                ) -> set[int] | None:
    """cudnn_majors, or None when nothing says which cuDNN is installed: an empty set only
    when the snapshot lists ``cudnn: []`` (looked, found none) and nothing else brings one."""
    majors = cudnn_majors(ctx, packages, torch_package)
    return majors if majors or ctx.env.none_found("cudnn") else None
