"""More checks of error_facts: the platform, the process environment, libraries, packages.

Imported by rules_errors for their registration; see error_facts for what a check answers.
"""

from __future__ import annotations

import re

from dnnctl.compat.errors import ErrorMatch
from dnnctl.compat.versions import Version, parse_cudnn
from dnnctl.doctor import stack, visible
from dnnctl.doctor.context import Context
from dnnctl.doctor.error_facts import (
    LIKELY,
    NO,
    UNKNOWN,
    YES,
    Outcome,
    check,
    lib_major,
    lib_version,
)
from dnnctl.doctor.parse import canonical_name

OS_NAMES = {"windows": "native Windows", "macos": "macOS", "linux": "Linux"}


@check("os")
def _os(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The snapshot's OS is one of ``arg`` ("windows", "windows+macos")."""
    kind = ctx.os_kind
    wanted = set((arg or "").split("+"))
    if kind is None:
        return UNKNOWN
    if kind == "linux" and ctx.wsl is not None and "wsl" in wanted:
        return Outcome(YES, "this is WSL")
    if kind in wanted:
        return Outcome(YES, f"this is {OS_NAMES.get(kind, kind)}")
    return Outcome(NO, f"this is {OS_NAMES.get(kind, kind)}"
                   + (" (WSL)" if ctx.wsl is not None else ""))


@check("wsl")
def _wsl(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """Inside WSL (``wsl:1`` / ``wsl:2``: that generation; WSL of unknown generation then
    answers None)."""
    if ctx.wsl is None:
        return Outcome(NO, "this is not WSL") if ctx.os_kind is not None else UNKNOWN
    if arg and ctx.wsl == 0:
        return UNKNOWN
    if arg and str(ctx.wsl) != arg:
        return Outcome(NO, f"this is WSL {ctx.wsl}")
    return Outcome(YES, f"this is WSL{' ' + str(ctx.wsl) if ctx.wsl else ''}")


@check("container")
def _container(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """Inside a container: a likely place for the cause (never proof of it)."""
    if ctx.container:
        return Outcome(LIKELY, "this runs in a container")
    return UNKNOWN


@check("hidden")
def _hidden(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """CUDA_VISIBLE_DEVICES hides every GPU (empty, -1, NoDevFiles, an index past the last GPU)."""
    env = ctx.env.environment or {}
    if "CUDA_VISIBLE_DEVICES" not in env:
        detected = isinstance((ctx.env.driver or {}).get("present"), bool)
        return Outcome(NO, "CUDA_VISIBLE_DEVICES is not set") if detected else UNKNOWN
    seen = visible.parse(ctx.env)
    if seen is not None and seen.hides_all:
        return Outcome(YES, f"CUDA_VISIBLE_DEVICES={seen.value!r} hides every GPU ({seen.why})")
    return Outcome(NO, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} shows a GPU")


@check("visible_set")
def _visible_set(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """CUDA_VISIBLE_DEVICES is set: CUDA numbers only the GPUs it names, from 0."""
    env = ctx.env.environment or {}
    if "CUDA_VISIBLE_DEVICES" in env:
        return Outcome(LIKELY, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}: CUDA "
                               "sees only those GPUs, numbered from 0")
    return UNKNOWN


# -- libraries --------------------------------------------------------------------------------

# the message's library (its stem, lower case) -> the snapshot's lists and pip wheels of it
_LIBS = {
    "cudnn": ("cudnn", ("nvidia-cudnn-cu",)),
    "cudart": ("cuda_runtimes", ("nvidia-cuda-runtime-cu",)),
    "cublas": ("cublas", ("nvidia-cublas-cu",)),
    "nvrtc": ("nvrtc", ("nvidia-cuda-nvrtc-cu",)),
    "nvjitlink": ("nvjitlink", ("nvidia-nvjitlink-cu",)),
    "cufft": (None, ("nvidia-cufft-cu",)),
    "curand": (None, ("nvidia-curand-cu",)),
    "cusolver": (None, ("nvidia-cusolver-cu",)),
    "cusparse": (None, ("nvidia-cusparse-cu",)),
}


def _family(lib: str) -> str | None:
    low = lib.lower().removeprefix("lib")
    for stem in _LIBS:
        if low.startswith(stem):
            return stem
    return None


def _copies(ctx: Context, stem: str) -> tuple[bool, list[tuple[Version, str]]]:
    """(whether the snapshot says which copies of a library there are, each copy's version
    and where it is from). A CUDA toolkit listed holds every CUDA library of its release."""
    listed, wheels = _LIBS[stem]
    known = False
    comps = []
    if listed in ("cudnn", "cuda_runtimes"):
        comps = getattr(ctx.env, listed)
        known = bool(comps) or ctx.env.none_found(listed)
    elif listed:
        comps = ctx.env.libraries.get(listed) or []
        known = bool(comps)
    if stem not in ("cudnn", "cudart"):
        kits = [c for c in ctx.env.cuda_runtimes if c.toolkit]
        comps, known = list(comps) + kits, known or bool(kits)
    out = [(v, c.source or "source unknown") for c in comps
           if (v := Version.maybe(c.version)) is not None]
    for canon, version in ctx.packages.items():
        for prefix in wheels:
            if canon.startswith(prefix) and canon[len(prefix):].isdigit():
                v = Version.maybe(version) if version else None
                if v is None and stem == "cudnn":
                    continue  # the wheel's name gives its CUDA major, not cuDNN's
                known = True
                out.append((v or Version.parse(canon[len(prefix):]), canon))
    cuda, cudnn = stack.torch_stack(ctx, packages=True)
    torch_lib = cudnn if stem == "cudnn" else cuda
    if torch_lib is not None and stack.torch_row(ctx, packages=True) is not None:
        out.append((torch_lib, "torch's wheel"))  # a torch wheel brings its own copies
        known = True
    return known, out


def _fits(v: Version, want: tuple[int, int | None], stem: str) -> bool:
    """A copy of version ``v`` has the library file asked for: the same major, and before
    CUDA 11 (whose libraries' file names carried major.minor) the same minor where the
    message names one."""
    major, minor = want
    if v.major != major:
        return False
    exact = minor is not None and stem != "cudnn" and major < 11
    return not exact or (len(v.key) > 1 and v.key[1] == minor)


@check("lib")
def _lib(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """``lib:absent``: no copy of the library asked for is here; ``lib:unreachable``: one is,
    so the loader is not looking where it is. A message that names no version is judged on
    whether any copy of the library is here."""
    lib = m.groups.get("lib") or ""
    stem = _family(lib) or ("cudnn" if "cudnn" in lib.lower() else None)
    if stem is None and "cudnn" in m.text.lower():
        stem = "cudnn"
    if stem is None:
        return UNKNOWN
    known, copies = _copies(ctx, stem)
    if not known:
        return UNKNOWN
    want = lib_version(m)
    name = stem + (f" {want[0]}" + (f".{want[1]}" if want[1] is not None and want[0] < 11
                                      and stem != "cudnn" else "") if want else "")
    here = [f"{v} ({src})" for v, src in copies]
    fit = [c for c, (v, _) in zip(here, copies) if want is None or _fits(v, want, stem)]
    have = f"only {', '.join(here)}" if here else "none"
    if arg == "absent":
        return (Outcome(NO, f"a {name} copy is here: {', '.join(fit)}") if fit
                else Outcome(YES, f"no {name} is installed here ({have})"))
    if fit:
        return Outcome(LIKELY, f"a {name} copy is here ({', '.join(fit)}), so the loader does "
                               "not find it")
    return Outcome(NO, f"no {name} is installed here ({have})")


@check("cudnn_compiled")
def _cudnn_compiled(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """``cudnn_compiled:absent``: no cuDNN copy here has the compiled major and a minor at
    least the compiled one (the message's ``compiled`` group), so none can satisfy the build."""
    library = m.groups.get("library") or ("cuDNN" if "cudnn" in m.text.lower() else "")
    if library.lower() != "cudnn":
        return UNKNOWN  # (a version of another library)
    want = parse_cudnn(m.groups.get("compiled", "").rstrip("."))  # ("9.4.0." ends a sentence)
    known, copies = _copies(ctx, "cudnn")
    if want is None or not known:
        return UNKNOWN
    good = [f"{v} ({src})" for v, src in copies
            if v.major == want.major and v.trunc(2) >= want.trunc(2)]
    here = ", ".join(f"{v} ({src})" for v, src in copies) or "none"
    if good:
        return Outcome(NO, f"a cuDNN the build accepts is here: {', '.join(good)}")
    return Outcome(YES, f"no cuDNN {want.major}.x at or above {want.trunc(2)} is installed here "
                        f"(only {here})")


@check("cudnn8_zlib")
def _cudnn8_zlib(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """cuDNN 8 on native Windows, which needs zlibwapi.dll (cuDNN 8.3-8.9)."""
    if ctx.os_kind is None or lib_major(m) is None:
        return UNKNOWN
    if ctx.os_kind == "windows" and lib_major(m) == 8:
        return Outcome(LIKELY, "cuDNN 8 on Windows loads zlibwapi.dll (8.3-8.9)")
    return Outcome(NO, "not cuDNN 8 on Windows")


# -- Python and packages -----------------------------------------------------------------------


@check("python_dll")
def _python_dll(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """Python 3.8+ on Windows no longer searches PATH for an extension's DLLs."""
    if ctx.os_kind != "windows" or ctx.python is None:
        return UNKNOWN if ctx.os_kind in (None, "windows") else Outcome(NO, "not Windows")
    if ctx.python >= Version.parse("3.8"):
        return Outcome(LIKELY, f"Python {ctx.python} on Windows searches PATH for no DLL")
    return Outcome(NO, f"Python {ctx.python} still searches PATH")


@check("python_h")
def _python_h(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    have = (ctx.env.toolchain or {}).get("python_h")
    if have is False:
        return Outcome(YES, "Python.h is not in the interpreter's include directory")
    if have is True:
        return Outcome(NO, "Python.h is installed")
    return UNKNOWN


@check("package")
def _package(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """``package:NAME``: NAME is installed (YES) or, with packages listed, not (NO)."""
    names = ctx.packages
    want = canonical_name(arg or "")
    if want in names:
        return Outcome(YES, f"{want} {names[want] or ''} is installed".replace("  ", " "))
    return Outcome(NO, f"{want} is not installed") if names else UNKNOWN


@check("no_package")
def _no_package(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """``no_package:NAME``: NAME is missing (with packages listed)."""
    names = set(ctx.packages)
    want = canonical_name(arg or "")
    if not names:
        return UNKNOWN
    return Outcome(NO, f"{want} is installed") if want in names else \
        Outcome(YES, f"{want} is not installed")


@check("cxx11_abi")
def _cxx11_abi(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The missing torch symbol's mangling says which C++ ABI the extension was built with
    (``St7__cxx11`` in it: the new one, ``_GLIBCXX_USE_CXX11_ABI=1``; ``Ss`` for std::string:
    the old one), against torch's own (its report, else its wheel's)."""
    symbol = m.groups.get("symbol") or ""
    if "__cxx11" in symbol:
        wants = True
    elif re.search(r"Ss(?:[A-Z_]|$)|NSs", symbol):
        wants = False
    else:
        return UNKNOWN
    abi = stack.torch_cxx11_abi(ctx)
    if abi is None:
        return UNKNOWN
    if abi == wants:
        return Outcome(NO, f"the extension and torch both use the {_abi(abi)} C++ ABI")
    return Outcome(YES, f"the extension was built with the {_abi(wants)} C++ ABI (its missing "
                        f"symbol says so) and torch uses the {_abi(abi)} one",
                   evidence={"extension_cxx11_abi": wants, "torch_cxx11_abi": abi})


def _abi(new: bool) -> str:
    return "new (cxx11abiTRUE)" if new else "old (cxx11abiFALSE)"


@check("stated")
def _stated(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The message states its cause itself (the versions it compares)."""
    return Outcome(YES, "the message says so")
