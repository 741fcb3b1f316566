"""The compilers a build on this machine runs, and whether Python's headers are here.

Two builds need them: nvcc runs a host compiler (gcc on Linux unless told otherwise, cl.exe on
Windows), and each CUDA release accepts a bounded range of them; Triton compiles a small C
launcher at run time with ``$CC``, else ``gcc``, else ``clang`` on PATH, against ``Python.h`` in
the interpreter's sysconfig include directory (triton/runtime/build.py). What is read, never
raising: ``gcc --version`` and ``clang --version`` (one short command each, under the probes'
time limit), cl.exe's banner where there is a cl.exe, ``$NVCC_CCBIN`` or the
``compiler-bindir`` line of the nvcc.profile beside the nvcc on PATH, or -ccbin in
``$NVCC_PREPEND_FLAGS`` (and that compiler's version), and one file test for Python.h.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from typing import Any

from dnnctl.doctor.host import Host

_GCC = re.compile(r"^\S+ \(.*\) (\d+\.\d+(?:\.\d+)?)", re.MULTILINE)  # gcc (Ubuntu ...) 11.4.0
_CLANG = re.compile(r"\bclang version (\d+\.\d+(?:\.\d+)?)")
_CL = re.compile(r"Compiler Version (19\.\d+(?:\.\d+)*)")
_BINDIR = re.compile(r"^\s*compiler-bindir\s*=\s*(\S.*?)\s*$", re.MULTILINE)
_CCBIN_FLAG = re.compile(r"(?:^|\s)(?:-ccbin|--compiler-bindir)[=\s]+['\"]?([^\s'\"]+)")
HOST_COMPILERS = ("g++", "gcc", "clang++", "clang")  # what a compiler-bindir directory holds


def compiler_version(host: Host, program: str) -> tuple[str, str] | None:
    """(kind "gcc" | "clang", version) from ``program --version``, None when unreadable."""
    res = host.run([program, "--version"], label=f"{os.path.basename(program)} --version")
    if res is None or not res.ok:
        return None
    m = _CLANG.search(res.stdout)
    if m:
        return "clang", m.group(1)
    m = _GCC.search(res.stdout)
    if m and "Free Software Foundation" in res.stdout:
        return "gcc", m.group(1)
    return None


def msvc_version(host: Host, program: str) -> str | None:
    """cl.exe's version from its banner ("Microsoft (R) C/C++ Optimizing Compiler Version
    19.44.35217 for x64", printed on stderr when run with no file), None when unreadable."""
    res = host.run([program], label="cl.exe")
    m = _CL.search(f"{res.stdout}\n{res.stderr}") if res is not None else None
    return m.group(1) if m else None


def nvcc_ccbin(host: Host) -> str | None:
    """The host compiler (or its directory) nvcc is pointed at: -ccbin in
    $NVCC_PREPEND_FLAGS / $NVCC_APPEND_FLAGS (conda's nvcc activation sets it), $NVCC_CCBIN,
    else the ``compiler-bindir`` of the nvcc.profile beside the nvcc on PATH."""
    for var in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"):
        m = _CCBIN_FLAG.search(host.environ.get(var) or "")
        if m:
            return m.group(1)
    if host.environ.get("NVCC_CCBIN"):
        return host.environ["NVCC_CCBIN"]
    nvcc = host.which("nvcc")
    if nvcc is None:
        return None
    profile = os.path.join(os.path.dirname(host.realpath(nvcc)), "nvcc.profile")
    text, _ = host.read_text(profile)
    m = _BINDIR.search(text or "")
    return m.group(1) if m else None


def _ccbin_record(host: Host, ccbin: str) -> dict[str, Any]:
    program = ccbin
    if "/" not in ccbin:  # a name, looked up on PATH as nvcc does
        program = host.which(ccbin) or ccbin
    elif os.path.isabs(ccbin) and host.is_dir(ccbin):
        program = next((os.path.join(ccbin, p) for p in HOST_COMPILERS
                        if host.exists(os.path.join(ccbin, p))), ccbin)
    out: dict[str, Any] = {"path": ccbin}
    found = (compiler_version(host, str(host.path(program)))
             if os.path.isabs(program) and host.exists(program) else None)
    if found:
        out["kind"], out["version"] = found
    return out


def python_include(host: Host) -> str | None:
    """Where Triton looks for Python.h: sysconfig's include directory of the default scheme
    (posix_local read as posix_prefix), for this interpreter only."""
    if host.python != sys.executable:
        return None  # another interpreter's sysconfig is not this one's
    get_scheme = getattr(sysconfig, "get_default_scheme", None)
    scheme = get_scheme() if get_scheme else sysconfig._get_default_scheme()  # type: ignore[attr-defined]
    if scheme == "posix_local":
        scheme = "posix_prefix"
    try:
        return sysconfig.get_paths(scheme=scheme)["include"]
    except (KeyError, ValueError):
        return None


def probe_toolchain(host: Host, include: str | None = None) -> dict[str, Any]:
    """The toolchain fields (TOOLCHAIN_FIELDS); ``include``: the Python include directory
    to look in (default: this interpreter's, as Triton computes it)."""
    out: dict[str, Any] = {}
    paths = {}
    for name in ("gcc", "clang"):
        program = host.which(name)
        paths[name] = program
        if program is None:
            out[name] = False
            continue
        found = compiler_version(host, str(host.path(program)))
        out[name] = found[1] if found else True
    cl = host.which("cl.exe")  # MSVC: nvcc's host compiler on Windows (never on Linux)
    if cl:
        out["msvc"] = msvc_version(host, cl) or True
    ccbin = nvcc_ccbin(host)
    if ccbin:
        out["nvcc_ccbin"] = _ccbin_record(host, ccbin)
    cc = host.environ.get("CC") or paths["gcc"] or paths["clang"]
    out["c_compiler"] = cc or False
    include = include if include is not None else python_include(host)
    if include:
        out["python_include"] = include
        out["python_h"] = host.exists(os.path.join(include, "Python.h"))
    return out
