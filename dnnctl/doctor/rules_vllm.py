"""vLLM against the OS and the torch installed beside it.

vLLM runs on Linux only (WSL 2 included): on native Windows there is no wheel and the source
build fails, so nothing else is compared there.

vLLM's compiled ops (``vllm/_C*.so``, and before 0.3 ``vllm/*_ops*.so``) are built against one
torch and its wheels pin it (table ``vllm_torch``: ``torch==2.5.1`` for 0.6.4-0.7.3; before
0.2.6 a floor such as ``torch>=2.1.0``, built against that floor's line). Another torch line
makes ``import vllm`` fail with an undefined C++ symbol (vllm-project/vllm#1807: vLLM 0.2.2
with torch 2.0.1, "undefined symbol: _ZN3c104cuda9SetDeviceEi"), the usual result of
installing or upgrading torch after vLLM. Another patch release of the pinned line is outside
the pin too, but torch keeps its C++ ABI within a line far more often: a warning.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import TORCH_INDEX
from dnnctl.compat.versions import TorchVersion, Version, VersionRange
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import torch_info
from dnnctl.errors import UsageError

SOURCE = (
    "vllm-project/vllm#1807 (vLLM 0.2.2 with torch 2.0.1: 'undefined symbol: "
    "_ZN3c104cuda9SetDeviceEi'; the reporter: 'vllm-0.2.2 is built with torch 2.1.0 ... use "
    "the right version torch'; WoosukKwon: the CUDA 11.8 build of vLLM 'requires manually "
    "installing the right version of PyTorch'); vllm-project/vllm#2797 and #3528 (the same "
    "error after `pip install -U torch`)")


def _vllm(ctx: Context) -> str | None:
    packages = ctx.packages
    info = (ctx.env.frameworks or {}).get("vllm") or {}
    if "vllm" not in packages and not info:
        return None
    return str(info.get("version") or packages.get("vllm") or "")


def _torch(ctx: Context) -> TorchVersion | None:
    text = str((torch_info(ctx, packages=True) or {}).get("version") or "")
    try:
        return TorchVersion.parse(text) if text else None
    except UsageError:
        return None


def _row(ctx: Context, vllm: Version) -> Row | None:
    return next((r for r in ctx.matrix.rows("vllm_torch") if not r.uncertain
                 and VersionRange.parse(r["vllm"]).contains(vllm)), None)


WINDOWS_SOURCE = (
    "https://docs.vllm.ai/en/v0.14.0/getting_started/installation/gpu/ (Requirements: 'OS: "
    "Linux'; 'vLLM does not support Windows natively. To run vLLM on Windows, you can use the "
    "Windows Subsystem for Linux (WSL) with a compatible Linux distribution'); "
    "docs/getting_started/installation/gpu.md at v0.26.0 (the same); "
    "https://docs.vllm.ai/en/v0.6.1.post2/_sources/getting_started/installation.rst "
    "('OS: Linux'); youkaichao in vllm-project/vllm#3941 ('native windows is not supported')")


def windows(ctx: Context, text: str) -> list[Finding]:
    """vLLM on native Windows: it publishes Linux wheels only and does not build there."""
    if ctx.os_kind != "windows" or ctx.wsl is not None:
        return []
    what = f"vllm {text}" if text else "vllm (version unknown)"
    return [finding(
        "cuda-mismatch", "error", "vllm", f"{what} on native Windows: vLLM supports Linux only "
        "(no Windows wheel; `pip install vllm` tries to build it there and fails)",
        fix="run vLLM in WSL 2 (a Linux distribution; the NVIDIA driver for Windows serves it) "
        "and there `pip install vllm`, or on a Linux host", source=WINDOWS_SOURCE,
        os="windows", vllm=text or None)]


def check(ctx: Context) -> list[Finding]:
    """The torch each vLLM wheel is built for against the torch here."""
    text = _vllm(ctx)
    if text is None:
        return []
    native = windows(ctx, text)
    if native:  # what the OS rules out comes before any version is compared
        return native
    vllm = Version.maybe(text.split("+")[0])
    torch = _torch(ctx)
    row = _row(ctx, vllm) if vllm is not None else None
    if vllm is None or torch is None or row is None:
        return [] if vllm is None or torch is None else [finding(
            "not-judged", "info", "vllm", f"vllm {text}: the torch its wheels are built for "
            "is not in the matrix, so whether its compiled ops load with torch "
            f"{torch.text} is not judged", source=SOURCE, vllm=text, torch=torch.text)]
    need = VersionRange.parse(row["torch"])
    line = Version.parse(row["built_line"]) if row.get("built_line") else None
    pin = need.lowest()
    built = line or (pin.trunc(2) if pin is not None else None)
    here = torch.release
    if need.contains(here) and (built is None or here.trunc(2) == built.trunc(2)):
        return []
    other_line = built is not None and here.trunc(2) != built.trunc(2)
    spec = row["torch"].replace(" ", "")
    cited = f"{SOURCE}; {cite(row)}"
    what = (f"its wheels require torch{spec}" + (f", built against torch {built}"
                                                 if line is not None else ""))
    message = (f"vllm {text} is built for another torch than torch {torch.text} ({what}): "
               + ("its compiled ops fail to load ('undefined symbol: ...' on `import vllm`)"
                  if other_line else "outside the pin, within the same torch line (which "
                  "usually keeps the C++ ABI; this pair is untested)"))
    return [finding(
        "build-mismatch", "error" if other_line else "warning", "vllm", message,
        fix=_fix(ctx, torch, pin, row), source=cited, vllm=text, torch=torch.text,
        torch_required=spec, built_line=line)]


def _fix(ctx: Context, torch: TorchVersion, pin: Version | None, row: Row) -> str:
    """The torch the wheel pins, of the CUDA variant torch has here where that wheel exists;
    or a vLLM release whose wheels are built for the torch here."""
    if pin is None:
        return "install the torch this vLLM release requires, or a vLLM built for this torch"
    variant = (torch.local or "").lower()
    has = variant.startswith("cu") and ctx.matrix.torch_row(str(pin.trunc(2)), variant)
    index = f" --index-url {TORCH_INDEX.format(variant=variant)}" if has else ""
    cmd = f"`pip install torch=={pin}{index}`"
    alt = _for_this_torch(ctx, torch, row)
    return cmd + (f" (the torch this vLLM is built for), or {alt}" if alt else "")


def _for_this_torch(ctx: Context, torch: TorchVersion, row: Row) -> str | None:
    """The newest vLLM releases whose wheels are built for this torch's release."""
    fits = []
    for r in ctx.matrix.rows("vllm_torch"):
        if r.uncertain or r is row:
            continue
        need = VersionRange.parse(r["torch"])
        line = Version.parse(r["built_line"]) if r.get("built_line") else need.lowest()
        if need.contains(torch.release) and line is not None and \
                line.trunc(2) == torch.release.trunc(2):
            fits.append(r)
    if not fits:
        return None
    best = max(fits, key=lambda r: VersionRange.parse(r["vllm"]).lowest() or Version((0,)))
    built = (f"{best['built_line']}.x" if best.get("built_line")
             else best["torch"].replace(" ", "").lstrip("="))
    return (f"a vLLM release built for torch {built} (vllm{best['vllm'].replace(' ', '')}, "
            "a build of torch's CUDA variant)")
