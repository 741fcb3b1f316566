"""conda's view of CUDA: the ``__cuda`` virtual package, and conda-forge builds with no CUDA.

- conda / mamba / micromamba give the solver a ``__cuda`` virtual package of the version the
  installed NVIDIA driver supports; conda-forge's CUDA builds (``libtorch=*=cuda12*``,
  tensorflow's cuda variants, ``py-xgboost=*=cuda*``) require it. On a machine with no driver
  (a cluster's login node, a CI or image build host) there is none: the CUDA variant is "missing
  on the system" and cannot be solved, or an unpinned request silently gets the CPU build.
  ``CONDA_OVERRIDE_CUDA`` sets it by hand. A conda CUDA build to be installed (its ``source``
  says conda, no ``installer`` read from an installed copy) in a snapshot whose driver is known
  absent is a warning; where neither a driver nor a GPU is named, a conditional one.
- A package whose conda-forge build for an OS has no CUDA (compat/limits.yaml
  ``conda_cpu_builds``: xgboost on Windows, where only the PyPI wheel has it): where the snapshot
  shows CUDA is meant to be used, a warning (conditional where the copy's source is unknown).
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_platform import cuda_evidence

VIRTUAL_SOURCE = (
    "conda docs, 'Managing virtual packages' (https://docs.conda.io/projects/conda/en/stable/"
    "user-guide/tasks/manage-virtual.html: '__cuda: Maximum version of CUDA supported by the "
    "display driver'; overriding detected packages with CONDA_OVERRIDE_CUDA); conda-forge blog "
    "2021-11-03, https://conda-forge.org/blog/2021/11/03/tensorflow-gpu/ (installing the CUDA "
    "build on a machine without a GPU: CONDA_OVERRIDE_CUDA); hmaarrfk (conda-forge) in "
    "conda-forge/pytorch-cpu-feedstock#364 ('__cuda ... which is missing on the system' on a "
    "GPU-less login node: 'See CONDA_OVERRIDE_CUDA'); XGBoost Installation Guide, Conda ('To "
    "force the installation of the GPU variant on a machine that does not have an NVIDIA GPU, "
    "use environment variable CONDA_OVERRIDE_CUDA')")
FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")
CONDA_CUDA_PACKAGES = ("cudatoolkit", "cuda-version", "pytorch-cuda", "cuda-cudart",
                       "cuda-runtime")


def check(ctx: Context) -> list[Finding]:
    packages = ctx.packages
    return _virtual_cuda(ctx) + _cpu_builds(ctx, packages)


def _virtual_cuda(ctx: Context) -> list[Finding]:
    """A conda CUDA build where conda sees no driver, so no ``__cuda``."""
    if (ctx.env.environment or {}).get("CONDA_OVERRIDE_CUDA") is not None:
        return []
    no_driver = ctx.driver_present is False
    unnamed = ctx.driver_present is None and ctx.driver is None and not ctx.gpus and \
        not (ctx.env.driver or {}).get("cuda")
    if not (no_driver or unnamed):
        return []
    out = []
    for name in FRAMEWORKS:
        info: dict[str, Any] = (ctx.env.frameworks or {}).get(name) or {}
        source = str(info.get("source") or "").lower()
        cuda = Version.maybe(info.get("cuda"))
        if "conda" not in source or (cuda is None and "cuda" not in source) or \
                info.get("installer"):
            continue  # an installed build (its installer read) was solved already
        what = f"{name} {info['version']}" if info.get("version") else name
        build = f"conda CUDA {cuda} build" if cuda is not None else "conda CUDA build"
        where = ("no NVIDIA driver is found here" if no_driver else
                 "if this machine has no NVIDIA driver (a cluster's login node, a build host): "
                 "the snapshot names none")
        override = (f"{cuda.major}.{cuda.key[1] if len(cuda.key) > 1 else 0}"
                    if cuda is not None else "12.0")
        out.append(finding(
            "conda-virtual-package", "warning", name,
            f"{where}{';' if no_driver else ','} so conda / mamba give the solver no __cuda "
            f"virtual package, which the {build} of {what} requires: the solve fails with "
            "'__cuda ... which is missing on the system' (or an unpinned request gets the CPU "
            "build)", fix=f"`export CONDA_OVERRIDE_CUDA={override}` before the conda / mamba / "
            "micromamba install (the CUDA version the GPU machines' driver supports, nvidia-smi's "
            "'CUDA Version' there, not newer), then use the environment on those machines",
            source=VIRTUAL_SOURCE, conditional=None if no_driver else True))
    return out


def _cpu_builds(ctx: Context, packages: dict[str, str]) -> list[Finding]:
    """A package whose conda-forge build for this OS is CPU-only, where CUDA is meant."""
    out = []
    meant = cuda_evidence(ctx) or next(
        (f"{n} is conda's CUDA runtime" for n in CONDA_CUDA_PACKAGES if n in packages), None)
    if not meant:
        return []
    for row in ctx.matrix.rows("conda_cpu_builds"):
        if row.uncertain or row["os"] != ctx.os_kind:
            continue
        conda = [n for n in row["conda_names"] if canonical_name(n) in packages]
        if row["package"] not in packages and not conda:
            continue
        version = packages.get(row["package"]) or next((packages[canonical_name(n)]
                                                        for n in conda), "")
        what = f"{row['package']} {version}".strip()
        os_name = row["os"].capitalize()
        if conda:
            said = (f"{what} is conda-forge's build ({', '.join(conda)} installed), which has "
                    f"no CUDA on {os_name}")
            if row["package"] in packages:
                said += (f"; a pip copy of {row['package']} in the same env shares its files "
                         "with it")
        else:
            said = (f"if {what} came from conda-forge (conda install {row['package']} or "
                    f"py-{row['package']}): that build has no CUDA on {os_name}, only the PyPI "
                    "wheel has")
        out.append(finding(
            "cuda-mismatch", "warning", row["package"],
            f"{said}: GPU training fails with '{row['error']}' ({meant} here)", fix=row["fix"],
            row=row, os=row["os"], build="cpu", conditional=None if conda else True))
    return out
