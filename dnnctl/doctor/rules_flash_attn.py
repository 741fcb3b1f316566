"""flash-attn's compiled extension against the torch it is imported into.

flash-attn's prebuilt wheels are built per torch minor, CUDA major and C++ ABI; their names
say which (``flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-...whl``; ``setup.py`` picks the one
matching the torch present at install time, else builds against it). ``flash_attn_2_cuda``
links torch's C++ libraries, so a torch upgraded (or reinstalled with the other ABI) after
flash-attn was installed fails at import with an undefined symbol. Judged where the snapshot
carries what it was built against: ``frameworks.flash-attn`` (``wheel``, ``torch``, ``cuda``,
``cxx11_abi``) or a ``packages`` version with the wheel's tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import CXX11_ABI_SOURCE, torch_cxx11_abi, torch_info, torch_stack
from dnnctl.errors import UsageError

NAME = "flash-attn"
TAG = re.compile(r"cu(\d+)torch(\d+\.\d+(?:\.\d+)?)cxx11abi(TRUE|FALSE)", re.IGNORECASE)
RELEASES = "https://github.com/Dao-AILab/flash-attention/releases"
SOURCE = (
    "Dao-AILab/flash-attention setup.py get_wheel_url (wheel_filename = "
    "f'{PACKAGE_NAME}-{flash_version}+cu{cuda_version}torch{torch_version}cxx11abi{cxx11_abi}"
    "-...', torch_version = f'{major}.{minor}', cxx11_abi = torch._C._GLIBCXX_USE_CXX11_ABI; "
    "'We're using the CUDA version used to build torch'); Dao-AILab/flash-attention#931 (tridao: "
    "'Wheels are built for torch 2.2.2 and torch 2.3.0 ... not compatible with 2.2.0. You can "
    "try previous version of flash-attn, or build from scratch': undefined symbol "
    "_ZN3c104cuda9SetDeviceEi); #853 (cu118torch2.2cxx11abiTRUE fails on pip torch 2.2.0, "
    "cxx11abiFALSE works); README ('pip install flash-attn --no-build-isolation')")
SYMBOL = {  # the undefined symbol each ABI mismatch reports (c10::Error's std::string argument)
    True: "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_string...",
    False: "_ZN3c105ErrorC2ENS_14SourceLocationESs",
}
ABI_SOURCE = ("huggingface/open-r1#684 (flash-attn 2.8.0.post2 built with "
              "_GLIBCXX_USE_CXX11_ABI=1 on torch 2.6.0: undefined symbol "
              "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_string...); "
              "Dao-AILab/flash-attention#1644 (the other way: _ZN3c105ErrorC2ENS_14Source"
              "LocationESs); " + CXX11_ABI_SOURCE)


@dataclass
class Build:
    """What a flash-attn was built against, as far as the snapshot says."""

    version: str
    torch: Version | None = None
    cuda: Version | None = None  # "12" (major only) or "12.2"
    abi: bool | None = None
    tag: str | None = None

    @property
    def known(self) -> bool:
        return self.torch is not None or self.cuda is not None or self.abi is not None


def build_of(ctx: Context) -> Build | None:
    """flash-attn's build, from its entry and its package version's local tag."""
    info: dict[str, Any] = (ctx.env.frameworks or {}).get(NAME) or {}
    packages = ctx.packages
    if not info and NAME not in packages:
        return None
    text = str(info.get("version") or packages.get(NAME) or "")
    m = TAG.search(f"{info.get('wheel') or ''} {text}")
    build = Build(text.split("+")[0] or "(version unknown)", tag=m.group(0) if m else None)
    if m:
        digits = m.group(1)
        build.cuda = Version.parse(digits if len(digits) <= 2 else f"{digits[:-1]}.{digits[-1]}")
        build.torch = Version.parse(m.group(2))
        build.abi = m.group(3).upper() == "TRUE"
    build.torch = Version.maybe(info.get("torch")) or build.torch
    build.cuda = Version.maybe(info.get("cuda")) or build.cuda
    if isinstance(info.get("cxx11_abi"), bool):
        build.abi = info["cxx11_abi"]
    return build


def check(ctx: Context) -> list[Finding]:
    """The flash-attn build against the torch installed: minor, CUDA major, C++ ABI."""
    build = build_of(ctx)
    if build is None or ctx.os_kind == "macos":
        return []
    what = f"{NAME} {build.version}" + (f" ({build.tag})" if build.tag else "")
    torch = torch_info(ctx, packages=True) or {}
    try:
        tver = TorchVersion.parse(str(torch.get("version") or ""))
    except UsageError:
        tver = None
    built_for = str(((ctx.env.frameworks or {}).get(NAME) or {}).get("torch") or "")
    if tver is not None and tver.custom and built_for != tver.text:
        return [_custom_torch(what, tver, build)]
    if not build.known or tver is None:
        missing = "which torch it was built against" if not build.known else \
            "the version of the torch it is imported into"
        return [finding("not-judged", "info", NAME, f"{what}: {missing} is not known, so "
                        "whether its compiled extension loads was not judged",
                        fix="name its wheel (frameworks.flash-attn.wheel, e.g. "
                        "cu12torch2.4cxx11abiFALSE) and torch's version", source=SOURCE)]
    tcuda = torch_stack(ctx)[0] if (ctx.env.frameworks or {}).get("torch") else \
        _row_cuda(ctx, tver)
    tabi = torch_cxx11_abi(ctx, torch)
    fix = _fix(tver, tcuda, tabi, build.version)
    out: list[Finding] = []
    line = tver.release.trunc(2)
    if build.torch is not None and build.torch.trunc(2) != line:
        out.append(finding(
            "build-mismatch", "error", NAME,
            f"{what} was built for torch {build.torch.trunc(2)}, and torch {tver.text} is "
            "installed: `import flash_attn` fails with 'flash_attn_2_cuda...so: undefined "
            "symbol' (e.g. _ZN3c104cuda9SetDeviceEi)", fix=fix, source=SOURCE,
            built_torch=str(build.torch), torch=tver.text))
    elif build.torch is not None and len(build.torch.parts) > 2 \
            and build.torch.trunc(3) != tver.release.trunc(3):
        out.append(finding(
            "build-mismatch", "warning", NAME,
            f"{what} was built against torch {build.torch}, and torch {tver.text} is "
            "installed: the same minor, yet a patch release can lack symbols the build "
            "uses (flash-attn wheels for 2.2.2 fail on 2.2.0)", fix=fix, source=SOURCE,
            built_torch=str(build.torch), torch=tver.text))
    if build.cuda is not None and tcuda is not None and build.cuda.major != tcuda.major:
        out.append(finding(
            "build-mismatch", "error", NAME,
            f"{what} was built for CUDA {build.cuda.major}, and torch {tver.text} runs CUDA "
            f"{tcuda}: the extension links the CUDA {build.cuda.major} libraries and torch's "
            "build, so it fails to import", fix=fix, source=SOURCE,
            built_cuda=str(build.cuda), torch_cuda=str(tcuda)))
    if build.abi is not None and tabi is not None and build.abi != tabi:
        out.append(finding(
            "build-mismatch", "error", NAME,
            f"{what} was built with the {'C++11' if build.abi else 'pre-C++11'} ABI "
            f"(cxx11abi{str(build.abi).upper()}) and torch {tver.text} with the "
            f"{'C++11' if tabi else 'pre-C++11'} one: `import flash_attn` fails with "
            f"'undefined symbol: {SYMBOL[build.abi]}'", fix=fix, source=ABI_SOURCE,
            built_cxx11_abi=build.abi, torch_cxx11_abi=tabi))
    if not out:
        said = [f"torch {build.torch.trunc(2)}" if build.torch else "",
                f"CUDA {build.cuda.major}" if build.cuda else "",
                f"cxx11abi{str(build.abi).upper()}" if build.abi is not None else ""]
        out.append(finding("ok", "info", NAME, f"{what}: built for "
                           + ", ".join(p for p in said if p) + f", as torch {tver.text} is",
                           source=SOURCE))
    return out


CUSTOM_SOURCE = (
    "Dao-AILab/flash-attention#709 (flash-attn 2.3.6's prebuilt wheel in "
    "nvcr.io/nvidia/pytorch:23.11: 'undefined symbol: _ZNK3c1017SymbolicShapeMeta18init_is_"
    "contiguousEv'; 'The same works when I build the wheel myself') and #809 (the same in the "
    "NGC container); setup.py ('FORCE_BUILD: Force a fresh build locally, instead of "
    "attempting to find prebuilt wheels', FLASH_ATTENTION_FORCE_BUILD == 'TRUE'); " + SOURCE)


def _custom_torch(what: str, tver: TorchVersion, build: Build) -> Finding:
    """flash-attn against a torch that is no release wheel (NGC's, a source build): the
    prebuilt wheels are built against release torches, whose C++ symbols it may not have."""
    said = f" (built for torch {build.torch})" if build.torch else ""
    return finding(
        "build-mismatch", "warning", NAME,
        f"{what}{said} beside torch {tver.text}, a custom build (an NGC container's or a "
        "source build): flash-attn's prebuilt wheels are built against release torches, so "
        "`import flash_attn` may fail with 'flash_attn_2_cuda...so: undefined symbol'",
        fix=f"build it against this torch: `pip uninstall -y {NAME}`, `export "
        "FLASH_ATTENTION_FORCE_BUILD=TRUE`, then `pip install --no-build-isolation "
        f"--no-cache-dir {NAME}` (or keep the flash-attn the container ships)", source=CUSTOM_SOURCE, torch=tver.text,
        built_torch=str(build.torch) if build.torch else None)


def _row_cuda(ctx: Context, tver: TorchVersion) -> Version | None:
    """The CUDA of a torch listed only as a package: its +cuXYZ tag, else PyPI's default wheel
    of its line on Linux."""
    if tver.local:
        return tver.cuda
    if ctx.os_kind not in (None, "linux"):
        return None
    row = next((r for r in ctx.matrix.torch_rows(tver.line) if r.get("pypi_default")), None)
    return Version.parse(row["cuda"]) if row else None


def _fix(tver: TorchVersion, cuda: Version | None, abi: bool | None, version: str) -> str:
    """The wheel of this torch, or a build against it (setup.py then fetches the wheel named
    after the torch present, else compiles; --no-cache-dir skips pip's cached old build,
    --no-deps keeps torch as it is; each command fits a line of the report)."""
    pin = f"=={version}" if Version.maybe(version) else ""
    if len(f"pip install --no-build-isolation --no-deps --no-cache-dir {NAME}{pin}") > 80:
        pin = ""  # a report's command line holds 80 columns
    want = (f"cu{cuda.major}" if cuda else "cu<its CUDA major>") + \
        f"torch{tver.release.trunc(2)}" + \
        ("cxx11abi" + str(abi).upper() if abi is not None else "cxx11abi<TRUE|FALSE>")
    return (f"install the flash-attn wheel built for this torch ({want}, from {RELEASES}), "
            f"or build it against this torch: `pip uninstall -y {NAME}`, then `pip install "
            f"--no-build-isolation --no-deps --no-cache-dir {NAME}{pin}`")
