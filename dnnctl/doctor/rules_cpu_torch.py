"""A torch with no CUDA: beside add-ons built for CUDA, and conda-forge's CPU variant.

- An add-on built for CUDA (xformers, flash-attn, vLLM, bitsandbytes before its multi-backend
  releases, any wheel tagged ``+cuXYZ`` such as torchvision / torchaudio from a CUDA index)
  runs its kernels on CUDA tensors of the torch beside it. A CPU-only torch (``+cpu``, or
  ``torch.version.cuda`` None) has no CUDA device at all ("Torch not compiled with CUDA
  enabled"), and an extension linked against the CUDA build of torch does not even load
  ("xFormers can't load C++/CUDA extensions ... (you have 2.1.0+cpu)"). The add-on says the
  CUDA torch was meant: an error where a GPU or driver is listed, else a warning. The fix is
  the CUDA build of torch the add-on matches: the torch it was built for, from PyTorch's
  ``whl/cuXYZ`` index of its CUDA, pinned with that local tag (a bare ``torch==2.1.0`` is
  already satisfied by ``2.1.0+cpu``); else the matrix's wheel for the GPU and driver.
- conda-forge builds pytorch in CPU and CUDA variants under one name; the build string tells
  them apart (``cuda120py312h...`` vs ``cpu_generic_py312h...``) and conda may solve to the
  CPU one, which a later ``cudatoolkit`` install does not change. A conda-installed torch
  that is known CPU-only, or that reports CUDA unavailable with no CUDA build recorded, is
  fixed by asking for the CUDA build string: ``conda install -c conda-forge "pytorch=*=cuda*"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dnnctl.compat.suggest import TORCH_INDEX
from dnnctl.compat.versions import TorchVersion, Version, tag_from_cuda
from dnnctl.doctor import rules_platform
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.errors import UsageError

ADDON_SOURCE = (
    "facebookresearch/xformers xformers/_cpp_lib.py ('xFormers can't load C++/CUDA "
    "extensions. xFormers was built for: PyTorch {torch_version} with CUDA {cuda_version} (you "
    "have {torch.__version__})') and README (wheels from "
    "https://download.pytorch.org/whl/cu126, built against that index's torch); "
    "invoke-ai/InvokeAI#5065 ('xFormers was built for: PyTorch 2.1.0+cu121 ... (you have "
    "2.1.0+cpu)': 'generations only run on the CPU'); Dao-AILab/flash-attention README "
    "(Requirements: CUDA toolkit or ROCm toolkit); "
    "https://docs.vllm.ai/en/latest/getting_started/installation/gpu.html (the PyPI wheel is "
    "compiled for CUDA); https://huggingface.co/docs/bitsandbytes/v0.45.1/installation "
    "('bitsandbytes is currently only supported on CUDA GPUs'); "
    "https://pytorch.org/get-started/locally/ (a CUDA build comes from "
    "https://download.pytorch.org/whl/cuXYZ, tagged +cuXYZ)")
CONDA_SOURCE = (
    "conda-forge/pytorch-cpu-feedstock recipe/meta.yaml (pytorch's build string is "
    "cuda<CUDA>py<PY>h<hash> for the CUDA variant, cpu_... for the CPU one); "
    "https://docs.conda.io/projects/conda/en/latest/user-guide/concepts/pkg-specs.html (a "
    "match spec name=version=build: pytorch=*=cuda*); conda-forge/pytorch-cpu-feedstock#105 "
    "('add track_feature to cpu builds to deprioritize them'); vocalpy/vak#470 (a "
    "conda-forge env solved to a torch with torch.cuda.is_available() False; cudatoolkit "
    "added afterwards did not help)")
CONDA_FIX = 'conda install -c conda-forge "pytorch=*=cuda*"'
CUDA_TAG = re.compile(r"\+(cu\d{2,3})(?![\d])", re.IGNORECASE)
# Add-ons whose released builds are CUDA (or ROCm) builds only; a local tag other than +cuXYZ
# (vLLM's +cpu, a +rocm build) says otherwise and is left out.
CUDA_ONLY = ("flash-attn", "vllm")
BNB_MULTI_BACKEND = Version.parse("0.46")  # the last CUDA-only docs are 0.45.x's


@dataclass(frozen=True)
class CudaAddon:
    """An installed add-on built for CUDA: how to name it, its build's CUDA tag and the torch
    release it was built against, where known."""
    text: str
    tag: str | None = None
    torch: str | None = None


def cuda_addons(ctx: Context) -> list[CudaAddon]:
    """The add-ons here that are built for CUDA."""
    packages = ctx.packages
    fw = {canonical_name(n): v or {} for n, v in (ctx.env.frameworks or {}).items()}
    out: list[CudaAddon] = []
    xformers = _xformers(ctx, fw.get("xformers"), packages.get("xformers"))
    if xformers is not None:
        out.append(xformers)
    for name in sorted(set(packages) | {n for n in CUDA_ONLY if n in fw}):
        if name in ("torch", "xformers"):
            continue
        text = str(fw.get(name, {}).get("version") or packages.get(name) or "")
        tag = CUDA_TAG.search(text)
        local = text.split("+", 1)[1] if "+" in text else ""
        label = f"{name} {text}".strip()
        if tag:
            out.append(CudaAddon(label, tag.group(1).lower()))
        elif (name in CUDA_ONLY and not local) or _bnb_cuda_only(name, text):
            out.append(CudaAddon(label))
    return out


def _bnb_cuda_only(name: str, text: str) -> bool:
    """bitsandbytes before its multi-backend releases: CUDA GPUs only."""
    v = Version.maybe(text) if name == "bitsandbytes" else None
    return v is not None and v < BNB_MULTI_BACKEND


def _xformers(ctx: Context, info: dict[str, Any] | None, package: str | None) -> CudaAddon | None:
    """xformers with the torch and CUDA of its build (cpp_lib.json), or a release the matrix
    knows (its wheels are CUDA builds, each pinned to one torch)."""
    if info is None and package is None:
        return None
    info = info or {}
    version = str(info.get("version") or package or "")
    built = str(info.get("torch") or "")
    tag = next((m.group(1).lower() for m in [CUDA_TAG.search(built)] if m), None)
    cuda = Version.maybe(info.get("cuda"))
    tag = tag or (tag_from_cuda(cuda) if cuda else None)
    known = bool(version) and any(r["xformers"] == version.split("+")[0]
                                  for r in ctx.matrix.rows("xformers"))
    if tag is None and not known:
        return None
    release = built.split("+")[0] or None
    text = f"xformers {version}".strip() + (f" (built for torch {built})" if built else "")
    return CudaAddon(text, tag, release)


def cpu_torch(ctx: Context, what: str, info: dict[str, Any], local: str | None,
              fix: str | None) -> list[Finding]:
    """A torch known or likely to be a CPU build: against the add-ons built for CUDA here and,
    for conda's pytorch, with conda-forge's CUDA variant as the fix; [] for any other torch."""
    known = local == "cpu" or info.get("cuda_build") is False
    conda = _conda(info)
    likely = (conda and info.get("cuda_available") is False and not local
              and info.get("cuda_build") is not True and not info.get("cuda"))
    if not (known or likely):
        return []
    ver = _version(info)
    addons = cuda_addons(ctx)
    own = f"`{CONDA_FIX}` (conda-forge's CUDA build of pytorch; `conda list pytorch` then " \
          "shows a cuda build string)" if conda else None
    if addons:
        return [addon_finding(ctx, what, ver, addons, own or fix, likely=not known)]
    if known:
        return rules_platform.cpu_only(ctx, "torch", what, fix=own or fix,
                                       source=CONDA_SOURCE if conda else None,
                                       line=ver.line if ver else None)
    return [finding(
        "cuda-mismatch", "warning", "torch",
        f"{what} was installed by conda and reports CUDA unavailable with no CUDA build "
        "recorded: most likely conda solved to the CPU variant of pytorch (conda-forge builds "
        "both under one name), which installing cudatoolkit does not change",
        fix=own, source=CONDA_SOURCE, build="cpu?", installer="conda")]


def addon_finding(ctx: Context, what: str, ver: TorchVersion | None, addons: list[CudaAddon],
                  fix: str | None, *, likely: bool = False, component: str = "torch") -> Finding:
    """The CPU torch beside CUDA add-ons: an error where a GPU or driver is listed."""
    gpu = bool(ctx.gpus or ctx.driver_present)
    names = "; ".join(a.text for a in addons)
    build = "most likely a CPU-only build" if likely else "a CPU-only build"
    return finding(
        "cuda-mismatch", "error" if gpu and not likely else "warning", component,
        f"{what} is {build}, but {names} {'is' if len(addons) == 1 else 'are'} built for "
        f"CUDA: with no CUDA in torch {'it' if len(addons) == 1 else 'they'} cannot use the "
        "GPU (an extension linked against "
        "torch's CUDA build does not load: 'xFormers can't load C++/CUDA extensions', 'Torch "
        "not compiled with CUDA enabled')",
        fix=torch_fix(ctx, ver, addons, fix), source=ADDON_SOURCE, build="cpu",
        addons=[a.text for a in addons])


def torch_fix(ctx: Context, ver: TorchVersion | None, addons: list[CudaAddon],
              fallback: str | None) -> str | None:
    """The CUDA build of torch the add-ons match: the torch they were built for (else the one
    here) with their CUDA tag, from that tag's index; else ``fallback`` after removing the CPU
    build (a ``torch==X.*`` request is satisfied by ``X+cpu``), else the matrix's newest."""
    if fallback and fallback.startswith("`conda"):
        return fallback
    tagged = next((a for a in addons if a.tag), None)
    release = (tagged.torch or (str(ver.release) if ver else None)) if tagged else None
    if tagged and release:
        cmd = f"pip install 'torch=={release}+{tagged.tag}' -i {TORCH_INDEX.format(variant=tagged.tag)}"
        return (f"`{cmd}` (torch {release} built for {tagged.tag}, as {tagged.text.split()[0]} "
                "was; -i is --index-url)")
    line = ver.line if ver else None
    text = fallback or rules_platform.cuda_torch_fix(ctx, line)
    m = re.match(r"(pip install [^(;]+?)(\s*\(.*)?$", text or "")
    if not m:
        return text
    return f"`pip uninstall -y torch`, then `{m.group(1)}`{m.group(2) or ''}"


def _conda(info: dict[str, Any]) -> bool:
    """Installed by conda from conda-forge (or a channel not named): the channel conda-forge
    builds both variants in."""
    source = str(info.get("source") or "").lower()
    by_conda = str(info.get("installer") or "").lower() == "conda" or source.startswith("conda")
    other = re.search(r"\bconda:(?!conda-forge)\w", source) is not None
    return by_conda and not other


def _version(info: dict[str, Any]) -> TorchVersion | None:
    try:
        return TorchVersion.parse(info["version"]) if info.get("version") else None
    except UsageError:
        return None
