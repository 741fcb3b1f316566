"""nvJitLink: the copy cuSPARSE / cuSOLVER load must be at least as new as their CUDA release.

The pip wheels of cuSPARSE and cuSOLVER find ``libnvJitLink.so.<major>`` through RUNPATH, and
the dynamic loader searches ``LD_LIBRARY_PATH`` before RUNPATH: an older copy there (a CUDA
toolkit's ``lib64``) wins over the wheel's own ``nvidia-nvjitlink`` and cuSPARSE fails to load
(``undefined symbol: __nvJitLink..._12_X``; JAX: "Unable to load cuSPARSE"). What cuSPARSE
needs comes from its version (matrix table ``cusparse``: the CUDA release it belongs to).
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.parse import canonical_name

SHADOW_SOURCES = ("env:", "system:", "conda:")
CUSPARSE = re.compile(r"nvidia-cusparse(-cu\d+)?")
SOURCE = (
    "https://docs.nvidia.com/cuda/nvjitlink/index.html#compatibility ('The library version "
    "itself must be >= the maximum version of the inputs, and the shared library version must "
    "be >= the version that was linked with'); jax-ml/jax#28929 and PR #28977 ('since cuSPARSE "
    "and cuSOLVER depend on the nvJitLink via RUNPATH, the incorrect version of nvJitLink might "
    "be loaded ... if LD_LIBRARY_PATH is set'); pytorch/pytorch#134929 ('libcusparse.so.12: "
    "undefined symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12')")
PIP_SOURCE = ("NVIDIA/cuvs#1794 (pip resolved an older nvidia-nvjitlink-cu12 than "
              "nvidia-cusparse-cu12 needs: 'undefined symbol: _nvJitLinkGetErrorLogSize_12_9')")
SYMPTOM = ("cuSPARSE / cuSOLVER fail to load ('undefined symbol: __nvJitLink..._{major}_{minor}, "
           "version libnvJitLink.so.{major}'; JAX: 'Unable to load cuSPARSE' and a CPU fallback)")


def check(ctx: Context) -> list[Finding]:
    """The nvJitLink each CUDA major's cuSPARSE would load, against what it needs."""
    copies = (ctx.env.libraries or {}).get("nvjitlink") or []
    if not copies:
        return []
    need, consumer = _need(ctx)
    out: list[Finding] = []
    for major in sorted({v.major for c in copies if (v := Version.maybe(c.version))}):
        same = [c for c in copies if (v := Version.maybe(c.version)) and v.major == major]
        first = _loaded_first(same)
        if first is None:
            continue
        if need is not None and need.major == major:
            out += _against_need(first, need, consumer, same)
        elif need is None:
            out += _against_wheel(first, same)
    return out


def _need(ctx: Context) -> tuple[Version | None, str | None]:
    """(the newest CUDA release among the installed cuSPARSE / cuSOLVER wheels, which one)."""
    best: tuple[Version, str] | None = None
    for name, text in (ctx.env.packages or {}).items():
        name = canonical_name(name)
        version = Version.maybe(text)
        if not CUSPARSE.fullmatch(name) or version is None:
            continue  # cuSOLVER's version has no table; its wheel pulls cuSPARSE in anyway
        row = ctx.matrix.cusparse_cuda(version)
        if row is not None and (best is None or Version.parse(row["cuda"]) > best[0]):
            best = (Version.parse(row["cuda"]), f"{name} {text}")
    return (best[0], best[1]) if best else (None, None)


def _loaded_first(copies: list[Component]) -> Component | None:
    """The copy the loader finds first: as detected, else the first on LD_LIBRARY_PATH
    (searched before RUNPATH), else the wheel's own."""
    marked = next((c for c in copies if c.loaded_first), None)
    if marked is not None:
        return marked
    if any(c.loaded_first is False for c in copies):
        return None  # detected, and none of these loads first: not judged
    env = next((c for c in copies if (c.source or "").startswith("env:")), None)
    return env or next((c for c in copies if (c.source or "").startswith("pip:")), None)


def _where(c: Component) -> str:
    return c.path or c.source or "?"


def _remove_fix(c: Component) -> str:
    where = _where(c)
    folder = where.rsplit("/", 1)[0] if "/" in where else where
    return (f"remove {folder} from LD_LIBRARY_PATH (or unset LD_LIBRARY_PATH) so the pip "
            "nvidia-nvjitlink copy loads")


def _against_need(first: Component, need: Version, consumer: str | None,
                  copies: list[Component]) -> list[Finding]:
    loaded = Version.parse(first.version)
    ev = {"loaded": str(loaded), "loaded_from": _where(first), "needed_min": str(need),
          "needed_by": consumer}
    if loaded.trunc(2) >= need.trunc(2):
        pip = next((c for c in copies if (c.source or "").startswith("pip:")), None)
        if first.source and first.source.startswith(SHADOW_SOURCES) and pip is not None:
            return [finding("library-shadowed", "info", "nvjitlink",
                            f"nvJitLink {loaded} ({_where(first)}) loads before the pip copy "
                            f"{pip.version}; it is new enough for {consumer} (CUDA {need})",
                            source=SOURCE, **ev)]
        return []
    symptom = SYMPTOM.format(major=need.major, minor=need.minor)
    if (first.source or "").startswith(SHADOW_SOURCES):
        return [finding(
            "library-shadowed", "error", "nvjitlink",
            f"nvJitLink {loaded} from {_where(first)} is found before the pip copy, but "
            f"{consumer} comes from CUDA {need} and needs nvJitLink >= {need}: {symptom}",
            fix=_remove_fix(first), source=SOURCE, **ev)]
    package = "nvidia-nvjitlink-cu12" if need.major == 12 else "nvidia-nvjitlink"
    return [finding(
        "cuda-mismatch", "error", "nvjitlink",
        f"nvJitLink {loaded} ({_where(first)}) is older than {consumer} needs (CUDA {need}): "
        f"{symptom}", fix=f"pip install -U '{package}>={need}'", source=PIP_SOURCE, **ev)]


def _against_wheel(first: Component, copies: list[Component]) -> list[Finding]:
    """No cuSPARSE version known: an older copy ahead of the wheel's own is suspect."""
    pip = [c for c in copies if (c.source or "").startswith("pip:") and Version.maybe(c.version)]
    if not pip or not (first.source or "").startswith(SHADOW_SOURCES):
        return []
    own = max(pip, key=lambda c: Version.parse(c.version))
    loaded, wanted = Version.parse(first.version), Version.parse(own.version)
    if loaded.trunc(2) >= wanted.trunc(2):
        return []
    return [finding(
        "library-shadowed", "warning", "nvjitlink",
        f"nvJitLink {loaded} from {_where(first)} is found before the pip copy {wanted} "
        f"({own.source}): if the cuSPARSE / cuSOLVER here come from a CUDA newer than {loaded} "
        f"(their versions are not in this snapshot), "
        f"{SYMPTOM.format(major=wanted.major, minor=wanted.minor)}", fix=_remove_fix(first),
        source=SOURCE, loaded=str(loaded), loaded_from=_where(first), bundled=str(wanted),
        bundled_from=own.source)]
