"""Builds that run on this machine: nvcc's host compiler, and Triton's run-time C build.

- nvcc: each CUDA release's ``crt/host_config.h`` stops every compile whose host compiler is
  outside the release's range (matrix table ``nvcc_host_compilers``). The compiler judged is
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

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import os_fixes
from dnnctl.doctor.context import Context, cite, finding, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.parse import canonical_name

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
    """nvcc's host compiler against each toolkit's range; Triton's C build."""
    if ctx.os_kind not in (None, "linux"):
        return []
    return _nvcc(ctx) + _triton(ctx)


# -- nvcc ----------------------------------------------------------------------------------


def _toolkits(ctx: Context) -> list[tuple[Component, Version]]:
    out = []
    for c in ctx.env.cuda_runtimes:
        v = Version.maybe(c.version) if c.toolkit else None
        if v is not None and len(v.key) >= 2:
            # nvcc --version's "V11.4.48" and version.txt's "10.2.89" carry a build number,
            # not the update: keep the release (major.minor) only
            out.append((c, v if len(v.key) == 3 and v.key[2] < 10 else v.trunc(2)))
    return out


def _compiler(ctx: Context) -> tuple[str, Version, str] | None:
    """(kind, version, how it was chosen) of the host compiler nvcc runs here."""
    tc = ctx.env.toolchain or {}
    ccbin = tc.get("nvcc_ccbin") or {}
    if ccbin.get("path"):
        v = Version.maybe(ccbin.get("version"))
        kind = ccbin.get("kind") or ("clang" if "clang" in ccbin["path"] else "gcc")
        return (kind, v, f"the host compiler nvcc is pointed at ({ccbin['path']})") if v \
            else None
    v = Version.maybe(tc.get("gcc")) if isinstance(tc.get("gcc"), str) else None
    return ("gcc", v, "the gcc on PATH, nvcc's default host compiler") if v else None


def _verdict(rows: list[Row], kind: str, major: int) -> str:
    """'ok', 'bad' or 'unsure' for a compiler major against a release's rows (a bare X.Y
    spans the rows of its updates: they must agree)."""
    seen = set()
    for row in rows:
        lo, hi = row.get(f"{kind}_min"), row.get(f"{kind}_max")
        disputed = str(major) in (row.get(f"{kind}_uncertain") or []) or row.uncertain
        if (hi is None and lo is None) or disputed:
            seen.add("unsure")
        elif (hi is not None and major > hi) or (lo is not None and major < lo):
            seen.add("bad")
        else:
            seen.add("ok")
    return seen.pop() if len(seen) == 1 else "unsure"


def _nvcc(ctx: Context) -> list[Finding]:
    kits = _toolkits(ctx)
    tc = ctx.env.toolchain or {}
    if not kits or not tc:
        return []
    picked = _compiler(ctx)
    if picked is None:
        if tc.get("gcc") is False and not tc.get("nvcc_ccbin"):
            names = ", ".join(f"CUDA {v.trunc(2)} ({c.source})" for c, v in kits)
            return [finding(
                "host-compiler", "warning", "cuda",
                f"nvcc is here ({names}) but no gcc is on PATH: nvcc compiles the host code of "
                "every .cu file with gcc, so it stops with 'nvcc fatal : Failed to preprocess "
                "host compiler properties'", fix=_gcc_install(ctx, None),
                source=NO_HOST_SOURCE)]
        return []
    kind, cv, how = picked
    judged = []
    for comp, cuda in kits:
        rows = ctx.matrix.nvcc_host_rows(cuda)
        judged.append((comp, cuda, rows, _verdict(rows, kind, cv.major) if rows else "unsure"))
    bad = [j for j in judged if j[3] == "bad"]
    if not bad:
        unsure = [j for j in judged if j[3] == "unsure" and j[2]]
        if unsure and not [j for j in judged if j[3] == "ok"]:
            comp, cuda, rows, _ = unsure[0]
            return [unknown("cuda", f"whether CUDA {cuda.trunc(2)}'s nvcc accepts {kind} {cv} as its "
                            "host compiler: the sources disagree (or the update is unknown)",
                            row=rows[0], cuda=cuda, compiler=f"{kind} {cv}")]
        return []
    comp, cuda, rows, _ = bad[0]
    lo, hi = _range(rows, kind)
    good = [j for j in judged if j[3] == "ok"]
    env = ctx.env.environment or {}
    flags = f"{env.get('NVCC_PREPEND_FLAGS') or ''} {env.get('NVCC_APPEND_FLAGS') or ''}"
    distro = any(_distro_nvcc(c) for c, *_ in bad)
    others = [v for v in ("CUDAHOSTCXX", "CC") if env.get(v)]
    severity = "error"
    notes = []
    if good:
        severity = "warning"
        notes.append("CUDA " + ", ".join(str(c.trunc(2)) for _, c, *_ in good)
                     + " accepts it: builds "
                     "that use that toolkit's nvcc work")
    if "-allow-unsupported-compiler" in flags:
        severity = "warning"
        notes.append("NVCC_*_FLAGS pass -allow-unsupported-compiler, which skips the check: the "
                     "build may still fail or miscompile")
    if distro and not (ctx.env.toolchain or {}).get("nvcc_ccbin"):
        severity = "warning"
        notes.append("a distribution's nvcc may be set up to run its own gcc")
    if others:
        severity = "warning"
        notes.append("builds that pass -ccbin from " + " / ".join(f"${v}={env[v]}" for v in others)
                     + " use that compiler instead")
    span = _span(kind, lo, hi)
    too = "newer" if hi is not None and cv.major > hi else "older"
    msg = (f"{kind} {cv} ({how}) is {too} than CUDA {cuda.trunc(2)}'s nvcc accepts ({span}): "
           + (HOST_CONFIG.format(max=hi) if too == "newer" and kind == "gcc" else
              f"nvcc stops every compile with 'unsupported {'GNU' if kind == 'gcc' else 'clang'} "
              "version' (crt/host_config.h)")
           + ", so building CUDA code with it (a torch source build, CUDA extensions, "
             "DeepSpeed ops) fails" + (f"; {'; '.join(notes)}" if notes else ""))
    cited = "; ".join(dict.fromkeys(cite(r) for r in rows))
    return [finding("host-compiler", severity, "cuda", msg, fix=_compiler_fix(
        ctx, kind, cuda, lo, hi, cv), source=f"{cited}; {CCBIN_SOURCE}", cuda=cuda,
        toolkit=comp.source, compiler=f"{kind} {cv}", accepted=span)]


def _range(rows: list[Row], kind: str) -> tuple[int | None, int | None]:
    los = [r.get(f"{kind}_min") for r in rows if r.get(f"{kind}_min") is not None]
    his = [r.get(f"{kind}_max") for r in rows if r.get(f"{kind}_max") is not None]
    return (max(los) if los else None), (min(his) if his else None)


def _span(kind: str, lo: int | None, hi: int | None) -> str:
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


def _compiler_fix(ctx: Context, kind: str, cuda: Version, lo: int | None, hi: int | None,
                  cv: Version) -> str:
    """Install an accepted gcc and point the builds at it, or a toolkit that accepts this one."""
    want = hi if hi is not None and cv.major > hi else lo
    if kind != "gcc" or want is None:
        return (f"use a host compiler CUDA {cuda} accepts ({_span(kind, lo, hi)}) and point the "
                "build at it (nvcc `-ccbin`, CMake `CUDAHOSTCXX`, torch extensions `CC` / "
                "`CXX`), or a CUDA toolkit that accepts this one")
    gxx = f"g++-{want}"
    text = (f"install gcc {want} ({_gcc_install(ctx, want)}) and point the build at it: "
            f"`export CC=gcc-{want} CXX={gxx} CUDAHOSTCXX={gxx}` (torch's extension builder "
            f"passes -ccbin $CC, CMake -ccbin $CUDAHOSTCXX; plain nvcc: `-ccbin {gxx}`)")
    newer = _toolkit_for(ctx, cv.major) if cv.major > (hi or 0) else None
    if newer is not None:
        text += (f"; or a CUDA toolkit that accepts gcc {cv.major} (CUDA {newer} or later), if "
                 "it still targets your GPUs")
    return text


def _toolkit_for(ctx: Context, major: int) -> Version | None:
    """The first CUDA release whose nvcc accepts gcc ``major`` with certainty."""
    fit = []
    for row in ctx.matrix.rows("nvcc_host_compilers"):
        hi, lo = row.get("gcc_max"), row.get("gcc_min")
        if hi is not None and hi >= major and (lo is None or lo <= major) \
                and str(major) not in (row.get("gcc_uncertain") or []):
            fit += [ref for op, ref, _ in VersionRange.parse(row["cuda"]).clauses
                    if op in (">=", "==")]
    return min(fit) if fit else None


# -- Triton --------------------------------------------------------------------------------


def _triton(ctx: Context) -> list[Finding]:
    packages = {canonical_name(n): v for n, v in (ctx.env.packages or {}).items()}
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
