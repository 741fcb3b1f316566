"""NCCL's shared-memory segments against the size of /dev/shm.

To move data between the GPUs of one machine NCCL creates shared-memory segments in /dev/shm
(several MB per peer and channel: 9.6 MB each in NVIDIA/nccl#342). Docker gives a container a
64 MB /dev/shm unless it is started with ``--shm-size`` or ``--ipc=host`` (Kubernetes pods
likewise), so a multi-GPU NCCL job there fails to initialize: "Call to posix_fallocate failed:
No space left on device", "Error while creating shared memory segment", "failed to extend
/dev/shm/nccl-...". NCCL's guide asks for ``--shm-size=1g --ulimit memlock=-1``. With the size
of /dev/shm in the snapshot (``system.shm_mib``) below 1 GiB this is a warning; inside a
container whose /dev/shm is not known it is a conditional one. One GPU, or no NCCL user in the
snapshot (its libraries, an nvidia-nccl wheel, a Linux CUDA build of torch), says nothing.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

NEEDED_MIB = 1024  # NCCL's guide: --shm-size=1g
SOURCE = (
    "NCCL User Guide, Troubleshooting, 'Shared memory' (https://docs.nvidia.com/deeplearning/"
    "nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html: 'NCCL creates shared "
    "memory segments, traditionally in /dev/shm ... If insufficient shared memory is available, "
    "NCCL will fail to initialize'; 'Docker containers default to limited shared and pinned "
    "memory resources ... --shm-size=1g --ulimit memlock=-1'; the same note in the 2.7.3 guide, "
    "https://docs.nvidia.com/deeplearning/nccl/archives/nccl_273/user-guide/docs/"
    "troubleshooting.html); NVIDIA/nccl#342 (NCCL 2.7.3 on 4 GPUs in nvidia/cuda:10.1: "
    "'posix_fallocate failed: No space left on device', 'Error while creating shared memory "
    "segment ... (size 9637888)'; the reporter: 'By default, the shm size is limited to 64MB "
    "under docker. After I increase the size, everything works'; NCCL_SHM_DISABLE=1 avoids it); "
    "pytorch/tutorials PR #2475 (a container without --shm-size=2gb 'would segfault in "
    "ncclShmOpen')")
_NCCL_PACKAGE = re.compile(r".*nccl.*")


def check(ctx: Context) -> list[Finding]:
    """One warning where NCCL would run across several GPUs with too small a /dev/shm."""
    system: dict[str, Any] = ctx.env.system or {}
    shm = system.get("shm_mib")
    users = _nccl_users(ctx)
    gpus = _gpu_count(ctx)
    if not users or gpus < 2 or (shm is not None and shm >= NEEDED_MIB):
        return []
    name = system.get("container")  # a runtime's name, True / False, or absent (ctx.container)
    kind = None if not ctx.container else \
        f"a {name} container" if isinstance(name, str) else "a container"
    if shm is None and kind is None:
        return []
    who = f"{', '.join(users)} with {gpus} GPUs"
    fails = ("NCCL fails to initialize: 'posix_fallocate failed: No space left on device' / "
             "'Error while creating shared memory segment' (NCCL_DEBUG=WARN shows it)")
    if shm is not None:
        message = (f"{who}: NCCL puts the buffers it moves between GPUs in /dev/shm, several MB "
                   f"per GPU pair and channel, and /dev/shm here is {shm} MiB"
                   + (f" (this is {kind})" if kind else "") + f": {fails}")
    else:
        message = (f"{who} in {kind}: NCCL puts the buffers it moves between GPUs in /dev/shm, "
                   "several MB per GPU pair and channel, and a container's /dev/shm is 64 MB "
                   "unless it was started with --shm-size or --ipc=host; its size is not in "
                   f"the snapshot: if it is that default, {fails}")
    return [finding(
        "shm-size", "warning", "nccl", message,
        fix="start the container with --shm-size=1g --ulimit memlock=-1 (or --ipc=host); in "
        "Kubernetes mount an emptyDir with medium: Memory at /dev/shm; check the size with "
        "df -h /dev/shm; as a stopgap `export NCCL_SHM_DISABLE=1` (slower: NCCL then uses "
        "P2P or the network between the GPUs)", source=SOURCE, shm_mib=shm,
        gpus=gpus, conditional=True if shm is None else None)]


def _nccl_users(ctx: Context) -> list[str]:
    """What in the snapshot runs NCCL: its library copies, an NCCL package, a Linux CUDA
    build of torch (its wheels bring NCCL)."""
    out = []
    copies = ctx.env.libraries.get("nccl") or []
    if copies:
        versions = ", ".join(c.version for c in copies if c.version)
        out.append(f"NCCL {versions}".strip())
    names = sorted(ctx.packages)
    if not copies and any(_NCCL_PACKAGE.fullmatch(n) for n in names):
        out.append(next(n for n in names if _NCCL_PACKAGE.fullmatch(n)))
    torch = (ctx.env.frameworks or {}).get("torch") or {}
    cuda_torch = torch.get("cuda") or "+cu" in str(torch.get("version") or "")
    if cuda_torch and ctx.os_kind != "windows" and torch.get("cuda_build") is not False:
        out.append(f"torch {torch['version']}" if torch.get("version") else "torch")
    return out


def _gpu_count(ctx: Context) -> int:
    physical = sum(not (g.mig or {}).get("profile") for g in ctx.env.gpus)
    count = (ctx.env.driver or {}).get("gpu_count")
    return max(physical, count if isinstance(count, int) else 0)
