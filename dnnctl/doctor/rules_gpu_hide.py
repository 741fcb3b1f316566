"""A GPU a framework cannot use, beside GPUs it can: hide it from CUDA.

Frameworks set up every GPU CUDA shows them; one whose compute capability they have no code
for makes them fail (TensorFlow 0.x: "cuDevicePrimaryCtxRetain: CUDA_ERROR_INVALID_DEVICE"
for that ordinal) or skip it. Where other GPUs here do run the framework, the working fix is
to show CUDA only those: ``CUDA_VISIBLE_DEVICES``. Its indices are CUDA's, which by default
numbers the GPUs fastest first (``CUDA_DEVICE_ORDER=FASTEST_FIRST``), while nvidia-smi, NVML and
a detected snapshot number them in PCI bus order; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA
use that order too (GPU UUIDs, where known, need neither). In a container the GPUs passed in
are chosen in nvidia-smi's numbering (``--gpus '"device=N"'``, ``NVIDIA_VISIBLE_DEVICES``,
nvidia-docker 1.0's ``NV_GPU``).

Below the lowest compute capability a framework's own build accepts (compat/limits.yaml
``source_build_floors``: TensorFlow's configure.py rejects anything under 3.0) no build of it
runs on the GPU, so a source build is never the fix there (:func:`floor_fix`).
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC
from dnnctl.doctor.context import Context, GpuInfo, cite, finding
from dnnctl.doctor.model import Finding, Gpu

SOURCE = (
    "CUDA C++ Programming Guide, 'CUDA Environment Variables' (CUDA_VISIBLE_DEVICES: 'Only the "
    "devices whose index is present in the sequence are visible to CUDA applications'; "
    "CUDA_DEVICE_ORDER: 'FASTEST_FIRST causes CUDA to enumerate the available devices in "
    "fastest to slowest order ... PCI_BUS_ID orders devices by PCI bus ID in ascending order', "
    "default FASTEST_FIRST), https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
    "index.html#env-vars; 3XX0 (NVIDIA) in NVIDIA/nvidia-docker#262 (a GTX 460 beside a GTX "
    "780 Ti: 'CUDA_VISIBLE_DEVICES=0 is the fastest GPU by default namely the GTX 780 Ti and "
    "1 will be the Fermi hence the failure'; 'Try isolating the cards sudo NV_GPU=1 "
    "nvidia-docker run'); https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/"
    "latest/docker-specialized.html (NVIDIA_VISIBLE_DEVICES / --gpus device= take GPU indices "
    "or UUIDs)")


def floor(ctx: Context, framework: str, cc: CC | None) -> Row | None:
    """The source_build_floors row that rules ``cc`` out for ``framework`` (None: it does not,
    or no row says)."""
    if cc is None:
        return None
    return next((r for r in ctx.matrix.rows("source_build_floors") if not r.uncertain
                 and r["framework"] == framework and cc < CC.parse(r["min_cc"])), None)


def floor_fix(framework: str, gpu: GpuInfo, row: Row) -> str:
    """What to do for a GPU below the framework's own build floor: another GPU."""
    return (f"use a GPU of compute capability {row['min_cc']} or newer: no {framework} build "
            f"runs on compute capability {gpu.cc} ({framework}'s own build accepts "
            f"{row['min_cc']} and newer, so a source build cannot add it)")


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """For every framework with no code for some GPUs here but code for others: its error's
    fix leads with hiding them, and one gpu finding gives the commands."""
    unusable: dict[str, list[Finding]] = {}
    for f in findings:
        if f.code == "arch-unsupported" and f.severity == "error" and \
                f.evidence.get("compute_capability") and f.component != "gpu":
            unusable.setdefault(f.component, []).append(f)
    physical = [(i, g) for i, g in enumerate(ctx.env.gpus) if not (g.mig or {}).get("profile")]
    infos = {i: ctx.gpus[i] for i, _ in physical if i < len(ctx.gpus)}
    hide: dict[int, list[str]] = {}
    for component, found in unusable.items():
        bad = {str(f.evidence["compute_capability"]) for f in found}
        keep = [i for i, g in infos.items() if g.cc is not None and str(g.cc) not in bad]
        gone = [i for i, g in infos.items() if g.cc is not None and str(g.cc) in bad]
        if not keep or not gone:
            continue
        for i in gone:
            hide.setdefault(i, []).append(component)
        for f in found:
            f.fix = (f"run {component} on the GPUs that it has code for: hide "
                     f"{_names(ctx, gone)} from CUDA (the gpu finding's commands)"
                     + (f"; otherwise {f.fix}" if f.fix else ""))
    if not hide:
        return []
    keep = [i for i, _ in physical if i not in hide]
    return [_finding(ctx, hide, keep)]


def _finding(ctx: Context, hide: dict[int, list[str]], keep: list[int]) -> Finding:
    gpus = ctx.env.gpus
    frameworks = sorted({c for cs in hide.values() for c in cs})
    env = ctx.env.environment or {}
    set_now = env.get("CUDA_VISIBLE_DEVICES")
    uuids = [gpus[i].uuid for i in keep]
    if all(uuids):
        select = f"`export CUDA_VISIBLE_DEVICES={','.join(uuids)}` (UUIDs: any device order)"
    else:
        select = (f"`export CUDA_DEVICE_ORDER=PCI_BUS_ID` and `export CUDA_VISIBLE_DEVICES="
                  f"{','.join(str(_index(gpus[i], i)) for i in keep)}` (without "
                  "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA numbers the GPUs fastest first, so its "
                  "indices need not be nvidia-smi's)")
    device = ",".join(str(_index(gpus[i], i)) for i in keep)
    where = "" if all(g.index is not None for g in gpus) else \
        " (indices are the GPUs' positions in the snapshot, taken as nvidia-smi's order)"
    already = (f"; CUDA_VISIBLE_DEVICES is {set_now!r} here: in CUDA's order unless "
               "CUDA_DEVICE_ORDER=PCI_BUS_ID is set" if set_now is not None else "")
    return finding(
        "hide-gpu", "warning", "gpu",
        f"{_names(ctx, sorted(hide))} {'is' if len(hide) == 1 else 'are'} visible beside GPUs "
        f"that {', '.join(frameworks)} {'runs' if len(frameworks) == 1 else 'run'} on, but "
        f"{', '.join(frameworks)} {'has' if len(frameworks) == 1 else 'have'} no code for "
        f"{'it' if len(hide) == 1 else 'them'}: a program that sets up every visible GPU fails "
        f"on {'it' if len(hide) == 1 else 'them'} or leaves {'it' if len(hide) == 1 else 'them'}"
        f" out{already}",
        fix=f"show CUDA only the other GPUs{where}: {select}; in a container, pass in only "
        f"those (docker run --gpus '\"device={device}\"', NVIDIA_VISIBLE_DEVICES={device}, or "
        f"nvidia-docker 1.0's NV_GPU={device}: nvidia-smi's numbering)",
        source=SOURCE + _floor_sources(ctx, frameworks, [ctx.gpus[i] for i in hide]),
        gpus=[_index(gpus[i], i) for i in sorted(hide)], keep=[_index(gpus[i], i) for i in keep])


def _floor_sources(ctx: Context, frameworks: list[str], hidden: list[GpuInfo]) -> str:
    rows = [r for r in ctx.matrix.rows("source_build_floors") if r["framework"] in frameworks
            and any(g.cc is not None and g.cc < CC.parse(r["min_cc"]) for g in hidden)]
    return f"; {cite(*rows)}" if rows else ""


def _names(ctx: Context, indices: list[int]) -> str:
    parts = []
    for i in indices:
        g, info = ctx.env.gpus[i], ctx.gpus[i]
        cc = f", compute capability {info.cc}" if info.cc is not None else ""
        parts.append(f"GPU {_index(g, i)} ({g.name or info.label}{cc})")
    return " and ".join(parts)


def _index(g: Gpu, i: int) -> int:
    return g.index if g.index is not None else i
