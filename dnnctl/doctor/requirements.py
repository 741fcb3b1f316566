"""Installed packages' own ``Requires-Dist`` entries on GPU stack packages.

A wheel declares what it needs (``torchvision 0.19.1`` requires ``torch==2.4.1``, ``torch
2.4.1`` requires ``triton==3.0.0``); pip honours it at install time, but a later install
(``pip install -U torch``, ``--no-deps``, another package's pin) can leave it unmet, and for
the packages watched here that breaks GPU code at import or load time. The requirement is
the package's own metadata, so judging it needs no table. Parsing and marker evaluation are
PEP 508 / PEP 440 as the ``packaging`` library implements them (pip's own).
"""

from __future__ import annotations

import re

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dnnctl.doctor.parse import canonical_name

# The projects whose requirements are kept: those where a version other than the one a
# package declares breaks GPU code when it is imported or loads its libraries (compiled
# extensions built against one torch / jaxlib / TensorFlow, pinned CUDA library wheels,
# torch's pinned Triton). Every one is also a package the probe lists (probe_python.relevant),
# so a name absent from a detected ``packages`` is not installed. Pure-Python or CPU-side dependencies
# (numpy, ml-dtypes, protobuf) are left out: their ranges are judged by pip, not here.
WATCHED_EXACT = frozenset({
    "torch", "torchvision", "torchaudio", "triton", "pytorch-triton", "xformers", "flash-attn",
    "tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tensorflow-intel", "tf-nightly",
    "tf-nightly-gpu", "tensorrt", "jax", "jaxlib", "onnxruntime-gpu", "paddlepaddle-gpu",
    "bitsandbytes", "vllm", "deepspeed",
})
WATCHED_PREFIXES = ("nvidia-", "jax-cuda", "cupy-cuda", "cupy-rocm", "tensorrt-cu")
# NVML's Python bindings: their version never breaks a GPU library's load
NOT_WATCHED = frozenset({"nvidia-ml-py", "nvidia-ml-py3"})
_EXTRA = re.compile(r"\bextra\s*[=!]=")


def watched(name: str) -> bool:
    """Is a requirement on the project ``name`` (any spelling) kept and judged?"""
    name = canonical_name(name)
    if name in NOT_WATCHED:
        return False
    return name in WATCHED_EXACT or name.startswith(WATCHED_PREFIXES)


def parse(line: str) -> Requirement | None:
    """One ``Requires-Dist`` value as a PEP 508 requirement, or None when it is malformed."""
    try:
        return Requirement(line)
    except InvalidRequirement:
        return None


def applies(req: Requirement) -> bool | None:
    """Whether the requirement's marker holds for this interpreter and platform.

    An ``extra == '...'`` marker is an optional feature nobody asked for here: False. None
    when the marker cannot be evaluated (never a guess)."""
    if req.marker is None:
        return True
    if _EXTRA.search(str(req.marker)):
        return False
    try:
        return req.marker.evaluate({"extra": ""})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName, TypeError,
            ValueError):
        return None


def kept(lines: list[str]) -> list[str]:
    """The requirement lines on watched projects whose markers hold here, as written."""
    out = []
    for line in lines:
        req = parse(line)
        if req is not None and watched(req.name) and applies(req) is True:
            out.append(line.strip())
    return out


def requirement(line: str) -> tuple[str, SpecifierSet] | None:
    """(canonical project, specifier) of a kept line; None for a malformed line or one
    behind an ``extra`` marker (a snapshot's lines were kept where their markers held)."""
    req = parse(line)
    if req is None or (req.marker is not None and _EXTRA.search(str(req.marker))):
        return None
    return canonical_name(req.name), req.specifier


def satisfied(spec: SpecifierSet, version: str) -> bool | None:
    """Does ``version`` meet ``spec``? PEP 440: ``==2.3.0`` takes ``2.3.0+cu121`` (a local
    label counts only where the specifier names one); pre-releases count as installed.
    None when the version is not PEP 440."""
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    return spec.contains(v, prereleases=True)

