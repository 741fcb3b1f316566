"""A torch built from source is judged as a source build, never by pytorch.org's wheel rows.

A snapshot says so in ``frameworks.torch.source`` or ``installer`` ("source build", "built from
source", "setup.py install", ...). Such a build has code for ``TORCH_CUDA_ARCH_LIST``, and with
the variable unset for the GPUs its build machine detected (torch's CMake "Auto" selection):
what the release wheels carry says nothing about it, and "no release build has code for this
GPU, build from source" is no fix for a build that is one. What the build reports
(``arch_list``, ``cuda``, cuDNN) is judged as for any custom build; with the arch list unknown
it is ``not-judged``, naming what the CUDA toolkits listed here can target.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import explicit_build

_SOURCE_BUILD = re.compile(r"source[ -]?buil[dt]|built from source|from (the )?source|"
                           r"setup\.py (install|develop|bdist)", re.IGNORECASE)
SOURCE = (
    "pytorch/pytorch README, 'From Source' (TORCH_CUDA_ARCH_LIST selects the architectures); "
    "cmake/Modules_CUDA_fix/upstream/FindCUDA/select_compute_arch.cmake ('Auto': the GPUs "
    "detected on the build machine) and nWEIdia in pytorch/pytorch#155314 (without the "
    "variable the build goes 'straight to the auto GPU detection mode'); peterjc123 in "
    "pytorch/pytorch#40138 ('export TORCH_CUDA_ARCH_LIST=7.5')")


def is_source_build(info: dict[str, Any]) -> bool:
    """Whether the snapshot says this torch was built from source."""
    text = f"{info.get('source') or ''} {info.get('installer') or ''}"
    return bool(_SOURCE_BUILD.search(text))


def check(ctx: Context, info: dict[str, Any], what: str) -> list[Finding]:
    """A source build: what it reports, else not judged, with the toolkits' reach."""
    reason = ("a source build: pytorch.org's wheel rows (arch list, bundled cuDNN) do not "
              "apply")
    out = explicit_build(ctx, "torch", what, info, reason, note="not-judged")
    for f in out:
        if f.code == "not-judged" and not f.fix:
            f.fix = ("give what the build reports: frameworks.torch.cuda, cudnn and arch_list "
                     "(torch.version.cuda, torch.backends.cudnn.version(), "
                     "torch.cuda.get_arch_list())")
    if info.get("arch_list"):
        return out
    sms = ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
    reach = _toolkits(ctx)
    arch = ";".join(str(g.cc) for g in ctx.known_ccs)
    message = (f"{what} is {reason}; it has code for TORCH_CUDA_ARCH_LIST, or for the GPUs "
               "of the machine that built it when that was unset, and its arch list is not in "
               "the snapshot, so its code for " + (sms or "the GPUs") + " was not judged"
               + (f" ({reach})" if reach else ""))
    return out + [finding(
        "not-judged", "info", "torch", message, source=SOURCE,
        fix="give frameworks.torch.arch_list (`python -c 'import torch; print(torch.cuda."
        "get_arch_list())'`)" + (f"; build with TORCH_CUDA_ARCH_LIST=\"{arch}\" and a CUDA "
                                 "toolkit that targets it" if arch else ""))]


def _toolkits(ctx: Context) -> str:
    """What the CUDA toolkits listed here can compile for, against each GPU."""
    parts = []
    for rt in ctx.env.cuda_runtimes:
        v = Version.maybe(rt.version)
        rel = ctx.matrix.cuda_release(v) if v is not None and rt.toolkit else None
        if rel is None:
            continue
        for gpu in ctx.known_ccs:
            can = str(gpu.cc) in rel["targets"]
            parts.append(f"the CUDA {v} toolkit here {'can' if can else 'cannot'} compile for "
                         f"sm_{gpu.cc.major}{gpu.cc.minor}")
    return "; ".join(parts)
