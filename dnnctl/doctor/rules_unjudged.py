"""What no other rule judged is said to be not judged, never shown as a pass.

Runs last, over the findings of every other rule:

- a driver that is present but of unknown version (``driver: {present: true}``): nothing was
  compared with it;
- CUDA runtimes with no driver version (nor the CUDA the driver reports) to run them on, and
  cuDNN / cuBLAS / NCCL / ... copies with neither a driver nor a GPU behind them;
- a package that ships CUDA code (``GPU_PACKAGES``, a name that says it is a CUDA build, or
  an entry of ``extensions``) that no rule judged: it is in no table of the matrix;
- an ``ok`` finding carries no fix (a numbered command under a pass reads as something to
  run), and every ``not-judged`` finding says what would let it be judged.
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_graph import PYG

DRIVER_FIX = ("give the driver's version (driver: {version: ...}; on the machine: "
              "`nvidia-smi --query-gpu=driver_version --format=csv,noheader`)")
# Packages that ship compiled CUDA code of their own (so a build of one CUDA or one torch
# release), by their distribution name, each with where that is stated.
GPU_PACKAGES = {
    "faiss-gpu": (
        "CUDA release", "facebookresearch/faiss#371 (ailzhang: 'we only did it for cuda90 for "
        "this release'; the conda package links libcublas.so.9.0) and #392 (Enet4: 'the conda "
        "package is pre-compiled specifically for CUDA 9.0, so it will only work for this "
        "version')"),
    "pytorch3d": (
        "torch release", "bottler in facebookresearch/pytorch3d#476 ('The prebuilt wheels on "
        "PyPI for pytorch3d are only for a particular version of pytorch, specifically pytorch "
        "1.6.0 at the moment ... Getting this wrong is likely to produce an error like' "
        "'undefined symbol'); its wheel index is per Python, CUDA and torch "
        "(dl.fbaipublicfiles.com/pytorch3d/packaging/wheels/py3X_cuXYZ_pytXYZ)"),
    "auto-gptq": (
        "torch release", "AutoGPTQ/AutoGPTQ#402 (auto-gptq's cu118 wheel beside torch 2.0.1: "
        "exllama_kernels 'undefined symbol: _ZN3c104cuda9SetDeviceEi'; an older wheel works) "
        "and TheBloke in #454 (torch 2.0: 'install AutoGPTQ 0.4.2, which should work on that "
        "system using the pre-built wheels')"),
    "autoawq-kernels": (
        "torch release", "casper-hansen in casper-hansen/AutoAWQ#466 ('You are installing "
        "wheels that are built with 2.2.0 and trying with torch 2.3.0. To fix this, you need "
        "to build from source')"),
    "exllamav2": (
        "torch release", "turboderp in turboderp-org/exllamav2#457 ('You're using a prebuilt "
        "wheel that doesn't match your PyTorch version. The 0.0.21 wheels are built for "
        "PyTorch 2.3.0')"),
    "dgl": (
        "torch release", "Rhett-Ying in dmlc/dgl#7809 (GraphBolt's library is per torch "
        "version: 'graphbolt_pytorch_2.4.1.dll' missing) and #7247 ('DGL 2.1.0 supports up to "
        "torch 2.2.1')"),
    "vllm": (
        "torch release", "https://docs.vllm.ai/en/v0.14.0/getting_started/installation/gpu/ "
        "('vLLM contains pre-compiled C++ and CUDA (12.8) binaries')"),
}
# packages with a table of their own (pins.yaml, graph.yaml), which needs their version
# (auto-gptq, pytorch3d, faiss-gpu: some releases, in prebuilt_pins)
TABLED = ("dgl", "vllm", "auto-gptq", "pytorch3d", "faiss-gpu")
# a distribution whose name says it is a CUDA build: -gpu, -cuXYZ, -cudaXY(x)
_CUDA_NAME = re.compile(r".+-(gpu|cu\d{2,3}|cuda\d{2,3}x?)")
NO_SOURCE = "source not given"
_LIBRARIES = ("cudnn", "cublas", "nccl", "nvjitlink", "nvrtc", "ptxas")


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Not-judged findings for what the others left silent (``findings`` is also tidied)."""
    for f in findings:
        if f.code == "ok":
            f.fix = None
    judged = {f.component for f in findings}
    said = " ".join(f.message.lower() for f in findings)
    out = _driver(ctx, judged) + _runtimes(ctx, judged) + _packages(ctx, judged, said)
    for f in findings + out:
        if f.code == "not-judged" and not f.fix:
            f.fix = _next_step(f)
    return out


def _driver(ctx: Context, judged: set[str]) -> list[Finding]:
    drv = ctx.env.driver or {}
    if ctx.driver is not None or ctx.driver_present is not True or "driver" in judged \
            or drv.get("cuda"):
        return []
    return [finding("not-judged", "info", "driver", "an NVIDIA driver is present, but its "
                    "version is not in the snapshot: nothing here was judged against it",
                    fix=DRIVER_FIX)]


def _runtimes(ctx: Context, judged: set[str]) -> list[Finding]:
    """CUDA with no driver version to judge it on; libraries with neither a driver nor a
    GPU. Not where the driver is known to be absent: the no-driver error says why nothing
    can run, and there is no version to ask for."""
    if ctx.driver_present is False:
        return []
    no_driver = ctx.driver is None and not (ctx.env.driver or {}).get("cuda")
    out: list[Finding] = []
    if no_driver and "cuda" not in judged:
        for rt in ctx.env.cuda_runtimes:
            if Version.maybe(rt.version) is None:
                continue
            out.append(finding(
                "not-judged", "info", "cuda", f"CUDA {rt.version} ({rt.source or NO_SOURCE}): "
                "the snapshot has no driver version, so whether the driver runs this "
                "CUDA was not judged", fix=DRIVER_FIX, cuda=rt.version))
    if not no_driver or ctx.gpus:
        return out
    for name in _LIBRARIES:
        copies = ctx.env.cudnn if name == "cudnn" else ctx.env.libraries.get(name, [])
        if copies and name not in judged:
            versions = ", ".join(c.version or "version unknown" for c in copies)
            out.append(finding(
                "not-judged", "info", name, f"{name} {versions}: the snapshot names no driver "
                "and no GPU, so nothing was judged against them",
                fix="add the GPU and driver (gpus: [{name: ...}], driver: {version: ...}), or "
                "run `dnnctl doctor` on the machine itself"))
    return out


def _packages(ctx: Context, judged: set[str], said: str) -> list[Finding]:
    """Each GPU package (or compiled extension) no rule said anything about (no finding of
    its component, none naming it)."""
    packages = {canonical_name(n): str(v or "") for n, v in (ctx.env.packages or {}).items()}
    for name, info in (ctx.env.extensions or {}).items():
        packages.setdefault(canonical_name(name), str((info or {}).get("version") or ""))
    out: list[Finding] = []
    for name, version in sorted(packages.items()):
        known = GPU_PACKAGES.get(name)
        extension = any(canonical_name(n) == name for n in ctx.env.extensions or {})
        if known is None and not extension and (not _CUDA_NAME.fullmatch(name)
                                                 or name.startswith("nvidia-")):
            continue  # nvidia-* wheels are CUDA's own libraries, judged with what loads them
        if name in PYG and "torch" in judged:
            continue  # judged against torch by the pyg_wheels table (silent where they fit)
        if _covered(name, judged) or re.search(rf"\b{re.escape(name)}\b", said):
            continue
        what = f"{name} {version}" if version else f"{name} (version unknown)"
        if known is not None:
            per, source = known
            message = (f"{what} ships CUDA code built for one {per}; it was not judged "
                       f"against the {per} here (" + ("its version, or the row for it, is "
                       "missing" if name in TABLED else "the matrix has no table of its builds")
                       + ")")
            fix = (f"check that its build is for the {per} installed here (its install page "
                   "lists the builds), else install the build for it or build it from source")
        else:
            source = None
            kind = "a compiled extension" if extension else "a CUDA build (its name says so)"
            message = f"{what} is {kind}; the matrix has no row for it, so it was not judged"
            fix = ("check by hand that it was built for the CUDA (and torch) installed here, "
                   "or add a row for it with --matrix extra.yaml (see compat/README.md)")
        out.append(finding("not-judged", "info", name, message, fix=fix, source=source,
                           package=name, version=version or None))
    return out


def _covered(name: str, judged: set[str]) -> bool:
    """Whether a finding speaks for the package (its own name, or its framework's)."""
    name = name.rsplit("/", 1)[-1]  # @tensorflow/tfjs-node-gpu: its component is tfjs-node-gpu
    base = re.sub(r"-(gpu|cu\d+|cuda\d+x?)$", "", name)
    stems = {name, base, base.replace("paddlepaddle", "paddle")}
    if re.fullmatch(r"jax-cuda\d+-(plugin|pjrt)", name):
        stems.add("jax")
    if name.startswith(("cupy-", "tensorflow-", "tf-nightly")):
        stems |= {"cupy", "tensorflow"}
    return bool(stems & judged)


def _next_step(f: Finding) -> str:
    if f.component in ("torch", "tensorflow", "jax", "cupy"):
        return (f"give its version (frameworks.{f.component}.version), or run `dnnctl doctor` "
                "where it is installed")
    return ("give the missing version in the snapshot, or run `dnnctl doctor` on the machine "
            "itself")
