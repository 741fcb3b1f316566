"""The machine around the GPU stack: the container this runs in and the size of /dev/shm.

Docker gives a container a 64 MB /dev/shm unless started with ``--shm-size`` or ``--ipc=host``
(Kubernetes pods likewise, unless an ``emptyDir`` of ``medium: Memory`` is mounted there);
NCCL puts its intra-node transport's segments there. A few file checks and one statvfs: no
command is run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dnnctl.doctor.host import Host

# PID 1's cgroup path names the runtime that started it (cgroup v1; v2 shows "0::/" inside)
_CGROUP_MARKS = (("kubepods", "kubernetes"), ("docker", "docker"), ("libpod", "podman"),
                 ("containerd", "containerd"), ("lxc", "lxc"))


def probe_system(host: Host, statvfs: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """``{"container": "docker" | ... | False, "shm_mib": 64}`` on Linux; {} elsewhere.
    ``statvfs`` replaces os.statvfs (tests)."""
    if not host.exists("/proc/self") and not host.exists("/dev/shm"):
        return {}  # not Linux (or a test root without these): unknown
    out: dict[str, Any] = {"container": _container(host) or False}
    stat = statvfs or getattr(os, "statvfs", None)
    if stat is not None and host.is_dir("/dev/shm"):
        try:
            st = stat(str(host.path("/dev/shm")))
            out["shm_mib"] = int(st.f_blocks * st.f_frsize) >> 20
        except (OSError, ValueError):
            pass
    return out


def _container(host: Host) -> str | None:
    if host.exists("/.dockerenv"):
        return "docker"
    if host.exists("/run/.containerenv"):
        return "podman"
    if host.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    text, _ = host.read_text("/proc/1/cgroup", limit=1 << 16)
    for mark, kind in _CGROUP_MARKS:
        if mark in (text or ""):
            return kind
    return None
