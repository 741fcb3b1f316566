"""A source-built torch CUDA extension has code only for the architectures it was compiled for.

detectron2, mmcv-full, apex, pytorch3d, a torch-scatter built from its sdist: any ``setup.py``
``CUDAExtension`` is compiled by torch's extension builder for ``TORCH_CUDA_ARCH_LIST``, and
without it for the GPUs of the machine that builds it (before torch 1.8 only the first GPU's
compute capability, with no PTX; from 1.8 every visible GPU's, plus PTX of the newest). Moved to
another GPU, its kernels fail with 'no kernel image is available for execution on the device'
(detectron2#233: built on a K80, sm_37, run on a P100, sm_60).

Judged from ``extensions.<name>.arch_list`` by CUDA's rules: a cubin runs on a GPU of the same
major and an equal or higher minor, PTX is JIT-compiled for its own or a newer GPU. With the
list unknown, a package known to be built from source (``built_from_source: true``, or
detectron2, which has no wheels on PyPI) is ``not-judged`` naming TORCH_CUDA_ARCH_LIST.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import parse_arch_list
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_libraries import arch_findings

ARCH_SOURCE = (
    "ppwwyyxx in facebookresearch/detectron2#233 ('You cannot compile code for one GPU "
    "architecture and run it on a different GPU architecture ... set TORCH_CUDA_ARCH_LIST env "
    "variable to contain architecture code for both architectures prior to building'); "
    "https://pytorch.org/docs/stable/cpp_extension.html (CUDAExtension: 'By default the "
    "extension will be compiled to run on all archs of the cards visible during the building "
    "process of the extension, plus PTX'; TORCH_CUDA_ARCH_LIST overrides it); "
    "pytorch/pytorch#48891 (torch 1.8: before it, 'builds the extension with compute "
    "capability of the 0th card'); NVIDIA Blackwell Compatibility Guide 1.2 (a cubin runs on "
    "the same major and a higher minor; PTX is JIT-compiled for newer GPUs)")
DETECTRON2_SOURCE = (
    "facebookresearch/detectron2 INSTALL.md ('git clone ... cd detectron2; pip install -e .'; "
    "'The compute compatibility of detectron2/torchvision defaults to match the GPU found on "
    "the machine during building, and can be controlled by TORCH_CUDA_ARCH_LIST environment "
    "variable during building'; 'remove the files you built (build/, **/*.so) and rebuild "
    "them'); detectron2/utils/collect_env.py ('detectron2 arch flags', "
    "detect_compute_compatibility(CUDA_HOME, so_file))")
# Packages with no CUDA wheels on PyPI, so an install is a build on some machine (or, for
# detectron2 0.1-0.6, Facebook's own prebuilt wheels).
KNOWN_SOURCE_BUILT = {"detectron2": DETECTRON2_SOURCE}


def check(ctx: Context) -> list[Finding]:
    """Every compiled extension listed (or source-only package installed) against the GPUs."""
    exts = {canonical_name(n): dict(v) for n, v in (ctx.env.extensions or {}).items()}
    for name, ver in (ctx.env.packages or {}).items():
        key = canonical_name(name)
        if key in KNOWN_SOURCE_BUILT:
            exts.setdefault(key, {}).setdefault("version", str(ver or "") or None)
    out: list[Finding] = []
    for name, info in sorted(exts.items()):
        out += _one(ctx, name, info)
    return out


def _one(ctx: Context, name: str, info: dict[str, Any]) -> list[Finding]:
    what = f"{name} {info.get('version') or '(version unknown)'}"
    source = KNOWN_SOURCE_BUILT.get(name)
    cite = f"{ARCH_SOURCE}; {source}" if source else ARCH_SOURCE
    entries = info.get("arch_list") or []
    targets = [str(t) for t in parse_arch_list(";".join(entries))] if entries else []
    if not targets:
        if info.get("built_from_source") is False or (
                name not in KNOWN_SOURCE_BUILT and not info.get("built_from_source")):
            return []
        return [finding(
            "not-judged", "info", name,
            f"{what} is a compiled CUDA extension built from source: it has code only for "
            "TORCH_CUDA_ARCH_LIST at its build, else for the GPU(s) of the machine that built "
            "it; that list is not known here, so its GPU code was not judged",
            fix=_check_fix(name), source=cite)]
    if not ctx.known_ccs:
        return [finding("not-judged", "info", name,
                        f"{what}: code for {' '.join(targets)}; no GPU is known here to judge "
                        "it against", source=cite)]
    found, _ = arch_findings(ctx, name, what, Row(), targets, _rebuild(ctx, name, targets),
                             source=cite)
    return found or [finding("ok", "info", name, f"{what}: code for {' '.join(targets)} "
                             "runs on every GPU here", source=cite)]


def _check_fix(name: str) -> str:
    if name == "detectron2":
        return ("read 'detectron2 arch flags' from `python -m detectron2.utils.collect_env` and "
                "name them (extensions.detectron2.arch_list)")
    return (f"list the architectures in its .so files (cuobjdump --list-elf --list-ptx) and "
            f"name them (extensions.{name}.arch_list)")


def _rebuild(ctx: Context, name: str, targets: list[str]) -> str:
    """Rebuild with TORCH_CUDA_ARCH_LIST naming the GPUs here (each line short enough to copy)."""
    ccs = sorted({str(g.cc) for g in ctx.known_ccs}, key=lambda c: [int(x) for x in c.split(".")])
    arch = ";".join(ccs)
    has = " ".join(t for t in targets)
    tail = (f" (add the compute capability of every other GPU it must run on, ';'-separated; "
            f"it has code for {has} now)")
    if name == "detectron2":
        return (f"in its source checkout, `rm -rf build/ **/*.so`, then `export "
                f"TORCH_CUDA_ARCH_LIST=\"{arch}\"`, then `pip install --no-build-isolation -e .`"
                + tail)
    sdist = f"pip install --no-cache-dir --no-binary {name} {name}"
    from_pypi = (f"; from its PyPI source release: `pip uninstall -y {name}`, the same export, "
                 f"then `{sdist}`") if len(sdist) <= 72 else ""
    return (f"in its source checkout, `rm -rf build/`, then `export "
            f"TORCH_CUDA_ARCH_LIST=\"{arch}\"`, then `pip install --no-build-isolation -e .`"
            + from_pypi + tail)
