"""A library release that loads a DLL nothing installs with it (matrix table ``library_dlls``).

cuDNN 8.3 to 8.9 on Windows load zlibwapi.dll, which neither Windows, the CUDA toolkit nor the
cuDNN archive installs; cuDNN 9 does not need it. Where a copy of such a release is listed on
that OS, a warning names the DLL and NVIDIA's install step: whether the DLL is on the search
path is not in the snapshot, so it is conditional, never a pass and never an error. A copy from
a source that brings the DLL with it (torch's Windows builds, conda's cudnn) is not flagged.
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import VersionRange, parse_cudnn
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding


def check(ctx: Context) -> list[Finding]:
    """Each listed cuDNN copy against the table's rows for this OS."""
    os_kind = ctx.os_kind
    out: list[Finding] = []
    for row in ctx.matrix.rows("library_dlls"):
        if row.uncertain or row["os"] != os_kind or row["library"] != "cudnn":
            continue
        rng = VersionRange.parse(row["versions"])
        for copy in ctx.env.cudnn:
            v = parse_cudnn(copy.version)
            src = copy.source or ""
            if v is None or not rng.contains(v) or src.startswith(
                    tuple(row.get("brought_by") or ())):
                continue
            where = f" ({src})" if src else ""
            out.append(finding(
                "dll-dependency", "warning", "cudnn",
                f"cuDNN {copy.version}{where} on Windows loads {row['dll']}, which Windows, "
                f"the CUDA toolkit and the cuDNN archive do not install (cuDNN "
                f"{row['versions']}): unless it is on the DLL search path, cuDNN fails with "
                f"{row['symptom']}; whether it is there is not in the snapshot",
                fix=row["fix"].replace("{cuda_bin}", _cuda_bin(ctx)), row=row,
                cudnn=copy.version, dll=row["dll"]))
    return out


def _cuda_bin(ctx: Context) -> str:
    """`` (C:\\...\\CUDA\\v11.8\\bin)``: the bin of the Windows toolkit listed, if one is."""
    for rt in ctx.env.cuda_runtimes:
        m = re.match(r"(?:system|nvcc):([A-Za-z]:[\\/].*)", rt.source or "")
        if m:
            root = re.sub(r"[\\/]bin[\\/]nvcc(\.exe)?$", "", m.group(1), flags=re.IGNORECASE)
            return f" ({root.rstrip(chr(92) + '/')}\\bin)"
    return ""
