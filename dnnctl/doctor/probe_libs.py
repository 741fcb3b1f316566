"""cuBLAS, NCCL, nvJitLink and NVRTC copies, and which one the dynamic loader finds first (no
library loaded).

Where a copy is decides the order: ``LD_LIBRARY_PATH`` first (in its order), then the wheel's
own copy (``nvidia-cublas-cu12``, ``nvidia-nccl-cu12``, ..., found by the framework's
RUNPATH), then conda, the ``ldconfig`` cache and CUDA toolkits. Versions come from the real
file name (``libcublas.so.12.4.5.8``, ``libnccl.so.2.21.5``) or the wheel's version.
"""

from __future__ import annotations

import os
import re

from dnnctl.doctor import parse
from dnnctl.doctor.host import Dist, Host
from dnnctl.doctor.model import Component
from dnnctl.doctor.probe_cuda import toolkit_dirs

LIBS = {  # name -> (file stem, pip distributions)
    "cublas": ("libcublas", ("nvidia-cublas", "nvidia-cublas-cu11", "nvidia-cublas-cu12",
                             "nvidia-cublas-cu13")),
    "nccl": ("libnccl", ("nvidia-nccl-cu11", "nvidia-nccl-cu12", "nvidia-nccl-cu13")),
    "nvjitlink": ("libnvJitLink", ("nvidia-nvjitlink-cu12", "nvidia-nvjitlink",
                                   "nvidia-nvjitlink-cu13")),
    # cuDNN 8+ loads libnvrtc.so by name; its sonames carry the minor before CUDA 12
    # (libnvrtc.so.11.2, libnvrtc.so.8.0), the major alone from 12 (libnvrtc.so.12)
    "nvrtc": ("libnvrtc", ("nvidia-cuda-nvrtc-cu11", "nvidia-cuda-nvrtc-cu12",
                           "nvidia-cuda-nvrtc")),
}
SONAME = {"nvrtc": r"\.so\.(\d+)(?:\.\d)?$"}  # default: lib<name>.so.<major>


def probe_libraries(host: Host, dists: dict[str, Dist],
                    ldconfig: dict[str, list[str]]) -> dict[str, list[Component]]:
    """Every copy of each library in LIBS, with ``loaded_first`` per soname major."""
    return {name: found for name in LIBS if (found := _copies(host, dists, ldconfig, name))}


def _copies(host: Host, dists: dict[str, Dist], ldconfig: dict[str, list[str]],
            name: str) -> list[Component]:
    stem, pips = LIBS[name]
    main = re.compile(re.escape(stem) + SONAME.get(name, r"\.so\.(\d+)$"))
    found: list[tuple[int, Component, str]] = []
    seen: set[str] = set()

    def add(path: str, real: str, source: str, rank: int, version: str | None) -> None:
        m = main.search(os.path.basename(path))
        if not m or real in seen:
            return
        seen.add(real)
        version = version or parse.soname_version(os.path.basename(real), stem)
        found.append((rank, Component(version=version, source=source, path=path), m.group(1)))

    for i, d in enumerate(host.env_paths("LD_LIBRARY_PATH")):
        for p in host.glob(f"{d}/{stem}.so.*"):
            add(p, host.realpath(p), "env:LD_LIBRARY_PATH", i, None)
    for pip in pips:
        dist = dists.get(pip)
        if dist is None:
            continue
        for f in dist.files():
            if main.search(f.name):
                add(str(f), os.path.realpath(f), f"pip:{pip}", 1000, dist.version)
    prefix = host.environ.get("CONDA_PREFIX")
    if prefix:
        for p in host.glob(f"{prefix}/lib/{stem}.so.*"):
            add(p, host.realpath(p), f"conda:{prefix}", 1001, None)
    for soname, paths in sorted(ldconfig.items()):
        if main.fullmatch(soname):
            for p in paths:
                add(p, host.realpath(p), "system:ldconfig", 2000, None)
    for root in toolkit_dirs(host):
        for p in host.glob(f"{root}/lib64/{stem}.so.*") + host.glob(f"{root}/lib/{stem}.so.*"):
            add(p, host.realpath(p), f"system:{root}", 3000, None)
    first: dict[str, int] = {}
    for rank, _, major in found:
        first[major] = min(rank, first.get(major, rank))
    out = []
    for rank, comp, major in sorted(found, key=lambda t: t[0]):
        comp.loaded_first = rank == first[major]
        out.append(comp)
    return out
