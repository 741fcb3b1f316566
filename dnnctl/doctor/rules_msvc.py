"""MSVC as nvcc's host compiler on Windows: how its versions are shown, fixed and cited.

rules_toolchain judges MSVC as it judges gcc, by the matrix table ``nvcc_msvc`` (the
_MSC_VER window each CUDA release's crt/host_config.h accepts); this module holds what is
MSVC's own: the text of a window ("MSVC 19.10 to 19.39 (_MSC_VER 1910-1939)"), the toolset to
install and select (``vcvars64.bat -vcvars_ver=14.39``), and the STL's own CUDA check that
-allow-unsupported-compiler does not skip.
"""

from __future__ import annotations

from dnnctl.doctor.context import Context

HOST_CONFIG = ("nvcc stops every compile with '#error -- unsupported Microsoft Visual Studio "
               "version!' (crt/host_config.h)")
# VS 2022's STL checks the CUDA compiler itself (yvals_core.h); from toolset 14.40 nvcc
# before 12.4 is refused by host_config.h too, so this adds to that error, never replaces it
STL_FROM = 1940
STL_NOTE = ("-allow-unsupported-compiler does not help here: this toolset's STL stops CUDA "
            "before 12.4 itself ('error STL1002: Unexpected compiler version, expected CUDA "
            "12.4 or newer', yvals_core.h; only -D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH "
            "skips that)")
STL_SOURCE = ("microsoft/STL stl/inc/yvals_core.h (_EMIT_STL_ERROR(STL1002, 'Unexpected compiler "
              "version, expected CUDA 12.4 or newer.') unless "
              "_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH); https://ww2.mathworks.cn/matlabcentral/"
              "answers/2178793-why-do-i-get-errors-when-running-the-mex-cuda-example-with-up-to-"
              "date-versions-of-visual-studio-comp (VS 2022 with the CUDA 12.2 nvcc: the host_config.h error, then "
              "with -allow-unsupported-compiler STL1002)")
VCVARS_SOURCE = ("https://learn.microsoft.com/en-us/cpp/build/building-on-the-command-line "
                 "(vcvarsall.bat / vcvars64.bat -vcvars_ver=14.xx selects an installed toolset); "
                 "https://learn.microsoft.com/en-us/cpp/preprocessor/predefined-macros (_MSC_VER)")


def shown(msc: int) -> str:
    """1929 -> 'MSVC 19.29'."""
    return f"MSVC 19.{msc - 1900:02d}"


def span_text(lo: int | None, hi: int | None) -> str:
    """An accepted window: 'MSVC 19.10 to 19.39 (_MSC_VER 1910-1939)'."""
    if lo is not None and hi is not None:
        return f"{shown(lo)} to 19.{hi - 1900:02d} (_MSC_VER {lo}-{hi})"
    return (f"{shown(hi)} (_MSC_VER {hi}) or older" if hi is not None else
            f"{shown(lo or 1900)} (_MSC_VER {lo}) or newer")


def host_text(lo: int, hi: int, written: str) -> str:
    """The MSVC here as the message names it."""
    if lo == hi:
        return f"{shown(lo)} (_MSC_VER {lo}; {written})" if written not in (
            str(lo), f"19.{lo - 1900:02d}") else f"{shown(lo)} (_MSC_VER {lo})"
    return f"{written} (MSVC _MSC_VER {lo}-{hi})"


# the last _MSC_VER of each Visual Studio (predefined-macros page: VS 2017 15.9 is 1916,
# VS 2019 16.11 1929, VS 2022 17.14 1944): a window's top may name no toolset that exists
LAST_OF = ((1919, 1916), (1929, 1929), (1949, 1944))


def _newest(hi: int, lo: int | None) -> int:
    """The newest released MSVC inside a window that ends at ``hi``."""
    for top, last in LAST_OF:
        if hi <= top:
            return max(min(hi, last), lo or 0)
    return hi


def _toolset(msc: int) -> tuple[str, str]:
    """(platform toolset, toolset version) of an _MSC_VER: 1939 -> ('v143', '14.39')."""
    minor = msc - 1900
    platform = "v141" if minor < 20 else "v142" if minor < 30 else "v143" if minor < 50 else "v145"
    return platform, f"14.{minor:02d}"


def fix(ctx: Context, cuda: object, lo: int | None, hi: int | None, here: int,
        newer: object | None) -> str:
    """Install the toolset the release accepts and build from its environment, or a CUDA
    toolkit that accepts the MSVC here."""
    want = _newest(hi, lo) if hi is not None else lo
    if want is None:
        return (f"use an MSVC CUDA {cuda} accepts ({span_text(lo, hi)}), or a CUDA toolkit that "
                "accepts this one")
    platform, version = _toolset(want)
    text = (f"install the MSVC {version} toolset (Visual Studio Installer, individual component "
            f"'MSVC {platform} ... build tools (v{version})') and build from its environment: "
            f"`vcvars64.bat -vcvars_ver={version}` (CUDA {cuda} accepts "
            f"{span_text(lo, hi)})")
    if newer is not None:
        text += (f"; or a CUDA toolkit that accepts {shown(here)} (CUDA {newer} or later), if "
                 "it still targets your GPUs")
    return text
