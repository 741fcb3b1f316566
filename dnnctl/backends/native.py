"""The native launch path: a small C extension, built on first use, that launches a kernel
in one call (parameter block packed in C) instead of a ctypes call fed from a Python loop.

Measured on the H200 host (benchmarks/profile_call.py): the Python side of a ctypes launch
(reading each argument's address, packing the block, ctypes' own argument conversion) cost
more than the driver's cuLaunchKernel itself. The extension (``_native.c``, next to this
file) links nothing: it gets cuLaunchKernel's address from ctypes once. It is compiled with
the system C compiler against this Python's headers into the cache
(``<cache root>/native/``; see :func:`dnnctl.paths.cache_root`), keyed by the source and the
interpreter, the same way Triton builds its launcher stubs. Where no compiler or no
``Python.h`` is found, or ``DNNCTL_NATIVE=0``, :func:`module` returns None and launches
stay on ctypes: nothing else changes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnctl.paths import cache_root

SOURCE = Path(__file__).with_name("_native.c")
NAME = "_dnnctl_native"
BUILD_SECONDS = 60


def enabled() -> bool:
    return os.environ.get("DNNCTL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "")


@functools.cache
def module() -> Any | None:
    """The loaded extension, building it if needed; None where it cannot be had."""
    if not enabled():
        return None
    try:
        path = built()
    except OSError:
        return None
    if path is None:
        return None
    try:
        return load(NAME, path)
    except (ImportError, OSError):
        return None


def load(name: str, path: Path) -> Any:
    """The extension module ``name`` from the shared library ``path`` (ImportError if it
    cannot be loaded)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"no module spec for {path}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{sys.version}|{sys.platform}|{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return h.hexdigest()[:16]


def built() -> Path | None:
    """The extension's path in the cache, compiled now if it is not there yet."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    out = cache_root() / "native" / f"{NAME}-{_key()}{suffix}"
    if out.is_file():
        return out
    cc = compiler()
    include = sysconfig.get_paths().get("include")
    if cc is None or not include or not Path(include, "Python.h").is_file():
        return None
    why = compile_into(out, lambda tmp: [*cc, "-O2", "-shared", "-fPIC", f"-I{include}",
                                         str(SOURCE), "-o", tmp], BUILD_SECONDS)
    return None if why else out


def compile_into(out: Path, command: Callable[[str], list[str]], seconds: float
                 ) -> str | None:
    """Build ``out`` with ``command(temporary path)``: None when it is there, else why not.
    The build writes a temporary file renamed into place (concurrent builders leave one
    complete file); a failed build leaves ``<out>.failed`` with the compiler's errors and
    is not tried again."""
    failed = out.with_name(out.name + ".failed")
    if failed.exists():
        return f"an earlier build failed (see {failed})"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run(command(tmp), capture_output=True, timeout=seconds,
                              check=False)
        if done.returncode != 0:
            failed.write_bytes(done.stderr[-4000:])
            return f"the build failed (see {failed})"
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the build did not run: {exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return None


def compiler(env: str = "CC", names: tuple[str, ...] = ("cc", "gcc", "clang"),
             config: str | None = "CC") -> list[str] | None:
    """The compiler command: ``$env``, else this Python's (its ``config`` variable), else
    the first of ``names`` on PATH (the C compiler by default; the C++ one with
    ``("CXX", ("c++", "g++", "clang++"), None)``)."""
    for cand in (os.environ.get(env), sysconfig.get_config_var(config) if config else None):
        if cand:
            parts = cand.split()
            if parts and shutil.which(parts[0]):
                return [parts[0]]
    for name in names:
        found = shutil.which(name)
        if found:
            return [found]
    return None
