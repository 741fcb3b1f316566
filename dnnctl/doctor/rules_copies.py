"""Several copies of one CUDA library, and CUDA libraries on LD_LIBRARY_PATH that are older
than the cuDNN beside them needs.

- A library listed several times (cuBLAS, NVRTC, cuDNN, the CUDA runtime) whose copy found
  first is of unknown version is never passed: which release the framework gets, and whether
  it matches its sibling libraries, is not known. NCCL (rules_nccl) and nvJitLink
  (rules_nvjitlink) are judged against their own pins.
- LD_LIBRARY_PATH is searched before the RUNPATH of a bundle or a wheel, so a CUDA directory
  there wins. cuDNN 8 loads ``libnvrtc.so`` by that name (no major in it), so any CUDA
  directory there gives it its NVRTC: cuDNN of each release needs a CUDA of the range its
  support matrix gives (cuDNN 8: 10.2 and later), and cuDNN 8's builds for CUDA 11 compile
  engines at run time and call ``nvrtcGetCUBIN``, which NVRTC has from CUDA 11.1: an older
  ``libnvrtc.so`` found first fails with "undefined symbol: nvrtcGetCUBIN". Other releases
  load versioned sonames, so only a directory of their own CUDA major can stand in.
"""

from __future__ import annotations

import ntpath
import os
import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange, parse_cudnn
from dnnctl.doctor import os_fixes
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.rules_libraries import LIBRARY_SOURCE

NAMES = {"cublas": "cuBLAS", "nvrtc": "NVRTC", "cudnn": "cuDNN", "cuda": "CUDA runtime"}
NVRTC_CUBIN = Version.parse("11.1")  # nvrtcGetCUBIN / nvrtcGetCUBINSize appear in CUDA 11.1
NVRTC_SOURCE = (
    "pytorch/pytorch torch/csrc/jit/codegen/cuda/executor_utils.cpp (nvrtcGetCUBIN used only "
    "'#if CUDA_VERSION >= 11010': 'compile to sass is not allowed prior to CUDA 11.1'); "
    "facefusion/facefusion-docker#9 ('Could not load library libcudnn_cnn_infer.so.8. Error: "
    "libnvrtc.so: cannot open shared object file': cuDNN 8 loads libnvrtc.so by that name); "
    "NixOS/nixpkgs#471394 ('cudnn uses nvrtc at runtime')")
COPIES_SOURCE = {
    "cublas": LIBRARY_SOURCE["cublas"],
    "cudnn": "pytorch/pytorch#119989 and #104808 (two cuDNN copies: the one found first wins)",
}


CUDNN_MINOR_SOURCE = (
    "https://docs.nvidia.com/deeplearning/cudnn/archives/cudnn-765/developer-guide/"
    "index.html#api-compat ('an application built against cuDNN 7.x is binary compatible "
    "with cuDNN library 7.y, where y>=x. Applications compiled with a cuDNN version 7.y are "
    "not guaranteed to work with 7.x release when y > x'); the cuDNN 8 and 9 guides keep "
    "the rule (API compatibility: newer minor releases only)")


def check(ctx: Context) -> list[Finding]:
    """Copies of unknown version found first, older cuDNN copies found first, then old CUDA
    directories before cuDNN."""
    return unknown_first(ctx) + older_cudnn_first(ctx) + old_cuda_before_cudnn(ctx)


def _groups(ctx: Context) -> list[tuple[str, list[Component]]]:
    libs = ctx.env.libraries or {}
    runtimes = [c for c in ctx.env.cuda_runtimes
                if not f"{c.source or ''}".startswith("pip:cupy")
                and "compat" not in f"{c.source or ''} {c.path or ''}".lower()]
    return [("cublas", libs.get("cublas") or []), ("nvrtc", libs.get("nvrtc") or []),
            ("cudnn", list(ctx.env.cudnn)), ("cuda", runtimes)]


def _major(copy: Component) -> int | None:
    """The major of a copy: from its version, else from the soname in its path (.so.11)."""
    v = parse_cudnn(copy.version) or Version.maybe(copy.version)
    if v is not None:
        return v.major
    m = re.search(r"\.so\.(\d+)", os.path.basename(copy.path or ""))
    return int(m.group(1)) if m else None


def _where(copy: Component) -> str:
    return ", ".join(p for p in (copy.path, copy.source) if p) or "an unnamed location"


def unknown_first(ctx: Context) -> list[Finding]:
    """A library with several copies whose copy found first is of unknown version."""
    out: list[Finding] = []
    for lib, copies in _groups(ctx):
        first = next((c for c in copies if c.loaded_first), None)
        if first is None or (parse_cudnn(first.version) or Version.maybe(first.version)):
            continue
        major = _major(first)
        others = [c for c in copies if c is not first
                  and (major is None or _major(c) in (None, major))]
        if not others:
            continue
        name = NAMES[lib]
        listed = "; ".join(f"{c.version or 'version unknown'} ({_where(c)})" for c in others)
        out.append(finding(
            "library-copies", "warning", lib,
            f"{len(others) + 1} copies of {name} are listed and the one found first "
            f"({_where(first)}) is of unknown version, so whether it is the release the "
            f"framework and the other libraries were built with is not known; the others: "
            f"{listed}. Mixed copies fail at load with errors such as 'symbol ... version "
            "... not defined in file ... with link time reference' or 'undefined symbol'",
            fix=f"keep one copy of {name} first on the search path: take the directories of "
            "the others off LD_LIBRARY_PATH or uninstall them (or name each copy's version, "
            "from its file name, so it can be judged)",
            source=COPIES_SOURCE.get(lib), loaded_from=_where(first),
            others=[_where(c) for c in others]))
    return out


def older_cudnn_first(ctx: Context) -> list[Finding]:
    """The cuDNN found first is an older minor of the same major than another copy listed.

    Within a major, cuDNN is compatible only with newer minors: a program built against the
    newer copy fails with the older one, and nothing built against the older one needs it.
    Copies a framework's wheel brings (pip:), and snapshots where a framework states the cuDNN
    it was built with, are judged by the framework rules instead."""
    if any((info or {}).get("cudnn") for info in (ctx.env.frameworks or {}).values()
           if isinstance(info, dict)):
        return []
    copies = list(ctx.env.cudnn)
    first = next((c for c in copies if c.loaded_first), None)
    have = parse_cudnn(first.version) if first is not None else None
    if first is None or have is None:
        return []
    newer = [(v, c) for c in copies if c is not first and not f"{c.source or ''}".startswith(
        "pip:") and (v := parse_cudnn(c.version)) is not None and v.major == have.major
        and (v.major, v.minor) > (have.major, have.minor)]
    if not newer:
        return []
    ver, best = max(newer, key=lambda t: t[0])
    paths = ntpath if ctx.os_kind == "windows" else os.path  # C:\...\bin\cudnn64_8.dll
    directory = paths.dirname(best.path) if best.path else None
    fix = (f"put {directory} first on the library path: "
           f"`{os_fixes.library_path_first(ctx, directory)}` (or remove the older copy)"
           if directory else "put the newer copy's directory first on "
           f"{os_fixes.library_path_var(ctx)}, or remove the older copy")
    return [finding(
        "library-copies", "warning", "cudnn",
        f"cuDNN {have} ({_where(first)}) is found first, but cuDNN {ver} ({_where(best)}) is "
        f"also here: a program built against cuDNN {ver.major}.{ver.minor} does not work with "
        f"the older {have.major}.{have.minor} (cuDNN is compatible with newer minors only), "
        "and errors such as CUDNN_STATUS_BAD_PARAM or 'compiled with CUDNN "
        f"{ver.major}.{ver.minor}, but CUDNN version in your machine is "
        f"{have.major}.{have.minor}' follow",
        fix=fix, source=CUDNN_MINOR_SOURCE, loaded=str(have), loaded_from=_where(first),
        newer=str(ver), newer_at=_where(best))]


def _cudnn_needs(ctx: Context, copy: Component) -> tuple[Version | None, Row | None,
                                                         int | None]:
    """(the oldest CUDA any build of this cuDNN release runs with, the matrix row that says
    so, the CUDA major of this copy where its source says: pip:nvidia-cudnn-cu12 -> 12)."""
    v = parse_cudnn(copy.version)
    if v is None:
        return None, None, None
    lows = [(low, r) for r in ctx.matrix.rows("cudnn") if not r.uncertain
            and VersionRange.parse(r["versions"]).admits(v)
            and (low := VersionRange.parse(r["cuda"]).lowest()) is not None]
    m = re.search(r"cudnn-cu(\d+)", copy.source or "")
    low, row = min(lows, key=lambda t: t[0]) if lows else (None, None)
    return low, row, (int(m.group(1)) if m else None)


def _env_dirs(ctx: Context) -> list[tuple[Component, str]]:
    """CUDA runtime and NVRTC copies found through LD_LIBRARY_PATH, with what they are."""
    out = [(c, "cuda") for c in ctx.env.cuda_runtimes if (c.source or "").startswith("env:")]
    out += [(c, "nvrtc") for c in (ctx.env.libraries or {}).get("nvrtc") or []
            if (c.source or "").startswith("env:")]
    return [(c, kind) for c, kind in out if c.loaded_first is not False]


def old_cuda_before_cudnn(ctx: Context) -> list[Finding]:
    """A CUDA directory on LD_LIBRARY_PATH older than what a cuDNN copy here needs."""
    out: list[Finding] = []
    for cudnn in ctx.env.cudnn:
        need, row, build_major = _cudnn_needs(ctx, cudnn)
        ver = parse_cudnn(cudnn.version)
        if need is None or ver is None:
            continue
        by_name = ver.major == 8  # libnvrtc.so, whatever the CUDA of the directory
        for copy, kind in _env_dirs(ctx):
            have = Version.maybe(copy.version)
            if have is None or not (by_name or have.major == build_major):
                continue
            floor = max(need, Version.parse(f"{build_major}.0")) if build_major else need
            old = have < floor
            no_cubin = by_name and have < NVRTC_CUBIN and ((build_major or 0) >= 11 or old)
            if not old and not no_cubin:
                continue
            out.append(_old_dir(copy, kind, have, cudnn, ver, floor, old, no_cubin, row))
    return out


def _old_dir(copy: Component, kind: str, have: Version, cudnn: Component, ver: Version,
             floor: Version, old: bool, no_cubin: bool, row: Row | None) -> Finding:
    where = copy.path or copy.source or "a directory on LD_LIBRARY_PATH"
    what = "CUDA" if kind == "cuda" else "NVRTC"
    why = []
    if old:
        why.append(f"cuDNN {ver} needs CUDA {floor} or newer")
    if no_cubin:
        why.append("cuDNN 8 loads the libnvrtc.so found first, and its builds for CUDA 11 "
                   "compile engines at run time with nvrtcGetCUBIN, which NVRTC has from CUDA "
                   "11.1 on ('undefined symbol: nvrtcGetCUBIN')")
    directory = where.rsplit("/", 1)[0] if where.endswith(".so") or ".so." in where else where
    return finding(
        "library-shadowed", "error", "cudnn",
        f"the {what} {have} libraries in {where} on LD_LIBRARY_PATH are found before the "
        f"ones cuDNN {ver} ({cudnn.source or cudnn.path or 'copy listed'}) was built with: "
        + "; ".join(why) + f", so cuDNN fails to load its sub-libraries ('Could not load "
        f"library libcudnn_cnn_infer.so.{ver.major}')",
        fix=f"remove {directory} from LD_LIBRARY_PATH (or unload the module that adds it) so "
        "the CUDA libraries that came with this cuDNN load",
        source="; ".join(s for s in (
            cite(row) if row is not None and old
            else None, NVRTC_SOURCE if no_cubin else None) if s),
        loaded=str(have), loaded_from=where, cudnn=str(ver), cuda_needed=str(floor))
