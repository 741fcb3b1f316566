"""A conda torch build for one CUDA release beside a conda CUDA runtime of another (matrix
table ``conda_cuda_runtimes``).

conda's pytorch builds name their CUDA in the build string (``py36_cuda9.0.176_cudnn7.1.2_1``)
and load the CUDA runtime of the env's ``cudatoolkit`` (``pytorch-cuda`` from 1.13); a solve
that pairs a cuda9.0 build with cudatoolkit 9.2 leaves torch without its runtime. The fix is
the runtime of the build's release, which, where the driver runs that release, comes before
any driver upgrade another rule asks for (a driver-too-old on the other runtime is given this
fix first). A runtime package absent, or a build CUDA unknown, says nothing.
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import fixcheck
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """torch's build CUDA against the conda runtime package of the same env."""
    info = (ctx.env.frameworks or {}).get("torch") or {}
    torch = Version.maybe(info.get("version"))
    build = _build_cuda(info)
    if torch is None or build is None or not _conda(ctx, info):
        return []
    for row in ctx.matrix.rows("conda_cuda_runtimes"):
        if row.uncertain or row["package"] != "pytorch" or \
                not VersionRange.parse(row["releases"]).contains(torch):
            continue
        have = _runtime(ctx, row["runtime"])
        if have is None or have.trunc(2) == build:
            continue
        cmd = row["install"].format(torch=info.get("version"), cuda=build)
        runs = fixcheck.driver_problem(ctx, build) is None
        drv = ctx.driver or (f"R{ctx.driver_branch}" if ctx.driver_span else None)
        why = (f"; driver {drv} runs CUDA {build}" if runs and drv else "")
        for f in findings:  # a driver upgrade for the other runtime comes second
            if f.code == "driver-too-old" and f"conda:{row['runtime']}" in f.message and runs:
                f.fix = f"`{cmd}` (torch's own CUDA {build}{why}); or {f.fix}"
        return [finding(
            "cuda-mismatch", "error", "torch",
            f"torch {info.get('version')} is conda's CUDA {build} build, but the env's "
            f"{row['runtime']} is {have}: torch loads the CUDA runtime of {row['runtime']}, "
            f"so it needs {row['runtime']} {build}",
            fix=f"`{cmd}` (or `conda install {row['runtime']}={build}`){why}"
            + ("" if runs else f" — {fixcheck.driver_problem(ctx, build)}"),
            row=row, cuda=build, runtime=f"{row['runtime']} {have}")]
    return []


def _conda(ctx: Context, info: dict) -> bool:
    src = f"{info.get('source') or ''} {info.get('installer') or ''}".lower()
    return "conda" in src or "pytorch" in (ctx.env.packages or {})


def _build_cuda(info: dict) -> Version | None:
    """The build's CUDA as X.Y: the build string's cudaX.Y, else the snapshot's torch CUDA."""
    m = re.search(r"cuda(\d+\.\d+)", str(info.get("source") or info.get("build") or ""))
    v = Version.maybe(m.group(1) if m else info.get("cuda"))
    return v.trunc(2) if v is not None else None


def _runtime(ctx: Context, package: str) -> Version | None:
    """The runtime package's version: a CUDA runtime from conda:<package>, or the package."""
    for rt in ctx.env.cuda_runtimes:
        if (rt.source or "").lower() == f"conda:{package}":
            return Version.maybe(rt.version)
    return Version.maybe((ctx.env.packages or {}).get(package))
