"""Builds that run on this machine: nvcc's host compiler, and Triton's run-time C build.

- nvcc: each CUDA release's ``crt/host_config.h`` stops every compile whose host compiler is
  outside the release's range (matrix tables ``nvcc_host_compilers`` for gcc / clang by major,
  ``nvcc_msvc`` for MSVC by _MSC_VER: cl.exe on PATH is the host compiler on Windows, a
  Visual Studio year or toolset is judged where all of its releases agree; rules_msvc). The
  compiler judged is
  ``toolchain.nvcc_ccbin`` where the snapshot names one (-ccbin in NVCC_PREPEND_FLAGS,
  NVCC_CCBIN, nvcc.profile), else the gcc on PATH, against every CUDA toolkit with an nvcc
  (``cuda_runtimes`` of source ``nvcc:`` / ``system:<dir>``): outside the range of all of them
  is an error, of some of them a warning; no gcc and no other host compiler a warning. Builds
  that pass their own -ccbin ($CUDAHOSTCXX for CMake, $CC for torch's extension builder), a
  distribution's nvcc (which may be set up with its own gcc) and NVCC_*_FLAGS with
  ``-allow-unsupported-compiler`` make an out-of-range compiler a warning.
- Triton: the first kernel a process runs builds a small C launcher (cuda_utils.c) with $CC,
  else gcc, else clang, against Python.h in sysconfig's include directory
  (triton/runtime/build.py); with a triton package here, no C compiler or no Python.h is an
  error. Linux only (the Windows port ships its own compiler); unknown fields are not judged.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import os_fixes, rules_msvc
from dnnctl.doctor.context import Context, cite, finding, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.parse import msc_ver_span

TRITON_PACKAGES = ("triton", "pytorch-triton", "triton-nightly")
HOST_CONFIG = ("nvcc stops with '#error -- unsupported GNU version! gcc versions later than {max} "
               "are not supported!' (crt/host_config.h)")
NO_HOST_SOURCE = ("mozilla/sccache#1048 (nvcc without its host compiler: 'gcc: No such file or "
                  "directory / nvcc fatal : Failed to preprocess host compiler properties.')")
CCBIN_SOURCE = ("torch/utils/cpp_extension.py unix_cuda_flags (extensions pass '-ccbin $CC'); "
                "https://cmake.org/cmake/help/latest/variable/CMAKE_CUDA_HOST_COMPILER.html "
                "($CUDAHOSTCXX: 'maps to the nvcc -ccbin option')")
TRITON_SOURCE = (
    "triton-lang/triton python/triton/runtime/build.py (_build: cc = $CC, else "
    "shutil.which('gcc'), else 'clang', else RuntimeError('Failed to find C compiler. Please "
    "specify via CC environment variable.'); py_include_dir = sysconfig.get_paths(scheme)"
    "['include'], posix_local read as posix_prefix)")
PYTHON_H_SOURCE = (
    "theroyallab/tabbyAPI PR#456 (fixes #453: 'Triton compiles its cuda_utils extension at "
    "runtime, which needs the CPython development headers ... sysconfig reports the "
    "interpreter's include path from the base prefix even inside a venv ... on Ubuntu 24.04 that "
    "path is owned by python3.12-dev'); sgl-project/sglang PR#18644 ('Add python3-dev ... "
    "Provides Python.h headers needed by Triton to JIT-compile its CUDA driver utilities')")
CC_SOURCE = ("lemonade-sdk/lemonade PR#2749 ('vLLM needs gcc, binutils, and libc headers at "
             "runtime to compile Triton launcher modules on first model load')")


def check(ctx: Context) -> list[Finding]:
    """nvcc's host compiler against each toolkit's range (MSVC on Windows); Triton's C
    build (Linux)."""
    if ctx.os_kind == "windows":
        return _nvcc(ctx)
    if ctx.os_kind not in (None, "linux"):
        return []
    return _nvcc(ctx) + _triton(ctx)


# -- nvcc ----------------------------------------------------------------------------------


def _toolkits(ctx: Context) -> list[tuple[Component, Version]]:
    out = []
    for c in ctx.env.cuda_runtimes:
        v = Version.maybe(c.version) if c.toolkit else None
        if v is not None and len(v.parts) >= 2:  # parts: "13.0" is a release, "13" is not
            # nvcc --version's "V11.4.48" and version.txt's "10.2.89" carry a build number,
            # not the update: keep the release (major.minor) only
            out.append((c, v if len(v.parts) == 3 and v.parts[2] < 10 else v.trunc(2)))
    return out


@dataclass(frozen=True)
class _Host:
    """The host compiler nvcc runs: gcc / clang by major, MSVC by _MSC_VER (``lo``..``hi``:
    what it may be, when written as a Visual Studio year or platform toolset)."""

    kind: str  # gcc | clang | msvc
    written: str  # its version as the snapshot has it
    how: str
    lo: int
    hi: int

    @property
    def text(self) -> str:
        return (rules_msvc.host_text(self.lo, self.hi, self.written) if self.kind == "msvc"
                else f"{self.kind} {self.written}")


def _compiler(ctx: Context) -> _Host | None:
    """The host compiler nvcc runs here: -ccbin's, else cl.exe on Windows, else gcc."""
    tc = ctx.env.toolchain or {}
    ccbin = tc.get("nvcc_ccbin") or {}
    how = f"the host compiler nvcc is pointed at ({ccbin.get('path')})"
    if ccbin.get("path"):
        path = str(ccbin["path"])
        kind = ccbin.get("kind") or ("msvc" if re.search(r"(^|[\\/])cl(\.exe)?$", path, re.I)
                                     else "clang" if "clang" in path else "gcc")
        return _host(kind, ccbin.get("version"), how)
    if ctx.os_kind == "windows" or (ctx.os_kind is None and tc.get("msvc")
                                    and not isinstance(tc.get("gcc"), str)):
        return _host("msvc", tc.get("msvc"), "cl.exe on PATH, nvcc's host compiler on Windows")
    return _host("gcc", tc.get("gcc"), "the gcc on PATH, nvcc's default host compiler")


def _host(kind: str, written: object, how: str) -> _Host | None:
    if not isinstance(written, str):
        return None
    if kind in ("msvc", "cl"):
        span = msc_ver_span(written)
        return _Host("msvc", written, how, *span) if span else None
    v = Version.maybe(written)
    return _Host(kind, written, how, v.major, v.major) if v else None


def _fields(kind: str) -> tuple[str, str]:
    """The matrix table and field prefix of a compiler kind."""
    return ("nvcc_msvc", "msvc") if kind == "msvc" else ("nvcc_host_compilers", kind)


def _verdict(rows: list[Row], host: _Host) -> str:
    """'ok', 'bad' or 'unsure' for the host compiler against a release's rows (a bare X.Y
    spans the rows of its updates, an MSVC named by its year spans its releases: they must
    agree)."""
    _, key = _fields(host.kind)
    seen = set()
    for row in rows:
        lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
        disputed = row.uncertain or any(host.lo <= int(v) <= host.hi
                                        for v in row.get(f"{key}_uncertain") or [])
        for value in {host.lo, host.hi}:
            if (hi is None and lo is None) or disputed:
                seen.add("unsure")
            elif (hi is not None and value > hi) or (lo is not None and value < lo):
                seen.add("bad")
            else:
                seen.add("ok")
    return seen.pop() if len(seen) == 1 else "unsure"


def _nvcc(ctx: Context) -> list[Finding]:
    kits = _toolkits(ctx)
    tc = ctx.env.toolchain or {}
    if not kits or not tc:
        return []
    host = _compiler(ctx)
    if host is None:
        if tc.get("gcc") is False and not tc.get("nvcc_ccbin") and ctx.os_kind != "windows":
            names = ", ".join(f"CUDA {v.trunc(2)} ({c.source})" for c, v in kits)
            return [finding(
                "host-compiler", "warning", "cuda",
                f"nvcc is here ({names}) but no gcc is on PATH: nvcc compiles the host code of "
                "every .cu file with gcc, so it stops with 'nvcc fatal : Failed to preprocess "
                "host compiler properties'", fix=_gcc_install(ctx, None),
                source=NO_HOST_SOURCE)]
        return []
    table, _ = _fields(host.kind)
    judged = []
    for comp, cuda in kits:
        rows = ctx.matrix.nvcc_host_rows(cuda, table)
        judged.append((comp, cuda, rows, _verdict(rows, host) if rows else "unsure"))
    bad = [j for j in judged if j[3] == "bad"]
    if not bad:
        unsure = [j for j in judged if j[3] == "unsure" and j[2]]
        if unsure and not [j for j in judged if j[3] == "ok"]:
            comp, cuda, rows, _ = unsure[0]
            return [unknown("cuda", f"whether CUDA {cuda.trunc(2)}'s nvcc accepts {host.text} "
                            "as its host compiler: the sources disagree (or the update, or "
                            "which release of it, is unknown)",
                            row=rows[0], cuda=cuda, compiler=host.text)]
        return []
    return [_refused(ctx, host, judged, bad[0])]


def _refused(ctx: Context, host: _Host, judged: list, bad: tuple) -> Finding:
    """The host-compiler finding for a toolkit whose nvcc refuses the compiler here."""
    comp, cuda, rows, _ = bad
    lo, hi = _range(rows, host.kind)
    if host.kind == "msvc":  # a disputed top of the window is neither shown nor offered
        disputed = {str(v) for r in rows for v in r.get("msvc_uncertain") or []}
        while hi is not None and str(hi) in disputed:
            hi -= 1
    good = [j for j in judged if j[3] == "ok"]
    env = ctx.env.environment or {}
    flags = f"{env.get('NVCC_PREPEND_FLAGS') or ''} {env.get('NVCC_APPEND_FLAGS') or ''}"
    distro = any(_distro_nvcc(j[0]) for j in judged if j[3] == "bad")
    others = [v for v in ("CUDAHOSTCXX", "CC") if env.get(v)]
    stl = host.kind == "msvc" and host.lo >= rules_msvc.STL_FROM and cuda < Version((12, 4))
    severity = "error"
    notes = []
    if good:
        severity = "warning"
        notes.append("CUDA " + ", ".join(str(c.trunc(2)) for _, c, *_ in good)
                     + " accepts it: builds "
                     "that use that toolkit's nvcc work")
    if "-allow-unsupported-compiler" in flags and stl:
        notes.append("NVCC_*_FLAGS pass -allow-unsupported-compiler, but " + rules_msvc.STL_NOTE)
    elif "-allow-unsupported-compiler" in flags:
        severity = "warning"
        notes.append("NVCC_*_FLAGS pass -allow-unsupported-compiler, which skips the check: the "
                     "build may still fail or miscompile")
    if distro and not (ctx.env.toolchain or {}).get("nvcc_ccbin"):
        severity = "warning"
        notes.append("a distribution's nvcc may be set up to run its own gcc")
    if others and host.kind != "msvc":
        severity = "warning"
        notes.append("builds that pass -ccbin from " + " / ".join(f"${v}={env[v]}" for v in others)
                     + " use that compiler instead")
    span = _span(host.kind, lo, hi)
    too = "newer" if hi is not None and host.lo > hi else "older"
    msg = (f"{host.text} ({host.how}) is {too} than CUDA {cuda.trunc(2)}'s nvcc accepts "
           f"({span}): "
           + (HOST_CONFIG.format(max=hi) if too == "newer" and host.kind == "gcc" else
              rules_msvc.HOST_CONFIG if host.kind == "msvc" else
              "nvcc stops every compile with 'unsupported "
              f"{'GNU' if host.kind == 'gcc' else 'clang'} version' (crt/host_config.h)")
           + ", so building CUDA code with it (a torch source build, CUDA extensions, "
             "DeepSpeed ops) fails" + (f"; {'; '.join(notes)}" if notes else ""))
    cited = "; ".join(dict.fromkeys(cite(r) for r in rows))
    extra = (f"; {rules_msvc.VCVARS_SOURCE}" + (f"; {rules_msvc.STL_SOURCE}" if stl else "")
             if host.kind == "msvc" else f"; {CCBIN_SOURCE}")
    return finding("host-compiler", severity, "cuda", msg, fix=_compiler_fix(
        ctx, host, cuda, lo, hi), source=f"{cited}{extra}", cuda=cuda,
        toolkit=comp.source, compiler=host.text, accepted=span)


def _range(rows: list[Row], kind: str) -> tuple[int | None, int | None]:
    _, key = _fields(kind)
    los = [r.get(f"{key}_min") for r in rows if r.get(f"{key}_min") is not None]
    his = [r.get(f"{key}_max") for r in rows if r.get(f"{key}_max") is not None]
    return (max(los) if los else None), (min(his) if his else None)


def _span(kind: str, lo: int | None, hi: int | None) -> str:
    if kind == "msvc":
        return rules_msvc.span_text(lo, hi)
    if lo is not None and hi is not None:
        return f"{kind} {lo} to {hi}"
    return f"{kind} {hi} or older" if hi is not None else f"{kind} {lo} or newer"


def _distro_nvcc(c: Component) -> bool:
    """An nvcc packaged by the distribution (/usr/bin/nvcc, nvidia-cuda-toolkit)."""
    where = f"{c.source or ''} {c.path or ''}"
    return "nvidia-cuda-toolkit" in where or "nvcc:/usr/bin/nvcc" in where or \
        (c.source or "") == "system:/usr"


def _gcc_install(ctx: Context, major: int | None) -> str:
    if os_fixes.rpm_distro(ctx):
        return (f"`sudo dnf install gcc-toolset-{major}-gcc-c++` (RHEL; then "
                f"/opt/rh/gcc-toolset-{major}/root/usr/bin/g++)" if major else
                "`sudo dnf install gcc gcc-c++`")
    return f"`sudo apt-get install gcc-{major} g++-{major}`" if major else \
        "`sudo apt-get install build-essential`"


def _compiler_fix(ctx: Context, host: _Host, cuda: Version, lo: int | None, hi: int | None
                  ) -> str:
    """Install an accepted compiler and point the builds at it, or a toolkit that accepts
    this one."""
    newer = _toolkit_for(ctx, host.kind, host.lo) if host.lo > (hi or 0) else None
    if host.kind == "msvc":
        return rules_msvc.fix(ctx, cuda, lo, hi, host.lo, newer)
    want = hi if hi is not None and host.lo > hi else lo
    if host.kind != "gcc" or want is None:
        return (f"use a host compiler CUDA {cuda} accepts ({_span(host.kind, lo, hi)}) and "
                "point the build at it (nvcc `-ccbin`, CMake `CUDAHOSTCXX`, torch extensions "
                "`CC` / `CXX`), or a CUDA toolkit that accepts this one")
    gxx = f"g++-{want}"
    text = (f"install gcc {want} ({_gcc_install(ctx, want)}) and point the build at it: "
            f"`export CC=gcc-{want} CXX={gxx} CUDAHOSTCXX={gxx}` (torch's extension builder "
            f"passes -ccbin $CC, CMake -ccbin $CUDAHOSTCXX; plain nvcc: `-ccbin {gxx}`)")
    if newer is not None:
        text += (f"; or a CUDA toolkit that accepts gcc {host.lo} (CUDA {newer} or later), if "
                 "it still targets your GPUs")
    return text


def _toolkit_for(ctx: Context, kind: str, value: int) -> Version | None:
    """The first CUDA release whose nvcc accepts the compiler (gcc major, _MSC_VER) with
    certainty."""
    table, key = _fields(kind)
    fit = []
    for row in ctx.matrix.rows(table):
        hi, lo = row.get(f"{key}_max"), row.get(f"{key}_min")
        if hi is not None and hi >= value and (lo is None or lo <= value) \
                and str(value) not in (row.get(f"{key}_uncertain") or []):
            fit += [ref for op, ref, _ in VersionRange.parse(row["cuda"]).clauses
                    if op in (">=", "==")]
    return min(fit) if fit else None


# -- Triton --------------------------------------------------------------------------------


def _triton(ctx: Context) -> list[Finding]:
    packages = ctx.packages
    name = next((n for n in TRITON_PACKAGES if n in packages), None)
    tc = ctx.env.toolchain or {}
    if name is None or not tc:
        return []
    label = f"{name} {packages[name]}".strip()
    out = []
    if tc.get("c_compiler") is False:
        out.append(finding(
            "triton-build", "error", "triton",
            f"{label} is installed but no C compiler is: Triton builds a small C launcher the "
            "first time a kernel runs ($CC, else gcc, else clang), so every Triton kernel "
            "(torch.compile, vLLM / SGLang / flash-linear-attention kernels) fails with "
            "'Failed to find C compiler. Please specify via CC environment variable.'",
            fix=("`sudo dnf install gcc`" if os_fixes.rpm_distro(ctx) else
                 "`sudo apt-get install build-essential`") + " (in a container image: in the "
            "stage that runs the model)", source=f"{TRITON_SOURCE}; {CC_SOURCE}",
            package=label, c_compiler=False))
    if tc.get("python_h") is False:
        include = tc.get("python_include") or "the interpreter's include directory"
        out.append(finding(
            "triton-build", "error", "triton",
            f"{label} is installed but Python.h is not in {include}, where Triton's run-time "
            "build of its C launcher looks: the first kernel fails with 'fatal error: Python.h: "
            "No such file or directory' (libraries then fall back to slower paths or stop)",
            fix=_headers_fix(ctx, tc.get("python_include")),
            source=f"{TRITON_SOURCE}; {PYTHON_H_SOURCE}", package=label,
            python_include=tc.get("python_include")))
    return out


def _headers_fix(ctx: Context, include: str | None) -> str:
    """Install the CPython headers of this interpreter, in this distribution's packages."""
    base = os.path.basename((include or "").rstrip("/"))
    py = base[len("python"):] if base.startswith("python3.") else None
    if py is None and ctx.python is not None:
        py = str(ctx.python)
    if include and not include.startswith("/usr/include/"):
        return (f"reinstall the Python whose headers belong in {include} with them (its "
                "development files), or use a Python that has them")
    if os_fixes.rpm_distro(ctx):
        return (f"`sudo dnf install python{py}-devel` (python3-devel for the system's default "
                "python3)" if py else "`sudo dnf install python3-devel`")
    pkg = f"python{py}-dev" if py else "python3-dev"
    return (f"`sudo apt-get install {pkg}` (in a container image: add it where python{py or '3'} "
            "is installed; a venv reads the headers from its base interpreter)")
