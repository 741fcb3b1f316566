"""What a torch in the environment brings: the CUDA and cuDNN of its build.

Its own fields win (``cuda`` from torch/version.py, the cuDNN it pins or reports); otherwise
the matrix row of its wheel (the ``+cuXYZ`` tag, or PyPI's default variant on Linux). Other
rules compare add-ons with it (onnxruntime-gpu reuses torch's CUDA and cuDNN; an extension
built here must use torch's CUDA major).
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import TorchVersion, Version, parse_cudnn
from dnnctl.doctor.context import Context
from dnnctl.errors import UsageError


def torch_row(ctx: Context) -> Row | None:
    """The matrix row of the torch wheel here (its +cuXYZ tag, or PyPI's default variant on
    Linux); None for a CPU / ROCm build, an unknown version or a wheel the matrix lacks."""
    info = (ctx.env.frameworks or {}).get("torch") or {}
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


def torch_stack(ctx: Context) -> tuple[Version | None, Version | None]:
    """(CUDA, cuDNN) of the torch build here; (None, None) for a CPU / ROCm build or none."""
    info = (ctx.env.frameworks or {}).get("torch") or {}
    if info.get("cuda_build") is False:
        return None, None
    if not info.get("version"):
        return Version.maybe(info.get("cuda")), parse_cudnn(info.get("cudnn"))
    local = str(info.get("local_tag") or "").lower() or \
        (str(info["version"]).split("+", 1)[1].lower() if "+" in str(info["version"]) else "")
    if local and not local.startswith("cu"):
        return None, None  # a CPU or ROCm build brings no CUDA
    row = torch_row(ctx)
    cuda = Version.maybe(info.get("cuda")) or (Version.maybe(row["cuda"]) if row else None)
    cudnn = (parse_cudnn(info.get("cudnn_runtime")) or parse_cudnn(info.get("cudnn"))
             or (parse_cudnn(row.get("cudnn")) if row else None))
    return cuda, cudnn


def cudnn_majors(ctx: Context, packages: dict[str, str]) -> set[int]:
    """cuDNN majors installed: the copies found, the nvidia-cudnn wheels (``packages``), and
    torch's own (torch_stack)."""
    texts = [c.version for c in ctx.env.cudnn]
    texts += [v for n, v in packages.items() if n.startswith("nvidia-cudnn-cu")]
    majors = {v.major for t in texts if (v := parse_cudnn(t)) is not None}
    _, torch_cudnn = torch_stack(ctx)
    if torch_cudnn is not None:
        majors.add(torch_cudnn.major)
    return majors


def cudnn_found(ctx: Context, packages: dict[str, str]) -> set[int] | None:
    """cudnn_majors, or None when nothing says which cuDNN is installed: an empty set only
    when the snapshot lists ``cudnn: []`` (looked, found none) and nothing else brings one."""
    majors = cudnn_majors(ctx, packages)
    return majors if majors or ctx.env.none_found("cudnn") else None
