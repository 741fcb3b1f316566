"""Fewer GPUs driven than named: ``driver.gpu_count`` (what NVML / nvidia-smi lists) below the
GPUs the snapshot names (matrix table ``undriven_gpus``).

A snapshot written by hand or from a report can list the machine's GPUs (from lspci or the
hardware it names) beside what the driver counts. Fewer counted than listed means some GPU
is not driven: the open kernel modules leave pre-Turing GPUs out, and a GPU can be bound to
vfio-pci or nouveau, unsupported by the branch, or fallen off the bus. Which one is not in
the snapshot, so each cause that fits the GPUs is named with its check; a GPU count absent
stays unknown and nothing is said.
"""

from __future__ import annotations

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, GpuInfo, cite, finding
from dnnctl.doctor.model import Finding


def check(ctx: Context) -> list[Finding]:
    """One error when the driver counts fewer physical GPUs than the snapshot lists."""
    count = _count((ctx.env.driver or {}).get("gpu_count"))
    physical = [(g, info) for g, info in zip(ctx.env.gpus, ctx.gpus, strict=True)
                if not (g.mig or {}).get("profile")]  # a MIG device is listed beside its GPU
    if count is None or count == 0 or count >= len(physical):
        return []  # 0 with GPUs listed: the no-gpu rule's case; absent: unknown
    causes, left_out = [], []
    flavor = (ctx.env.driver or {}).get("kernel_module_type")  # known: rules_kernel_module's
    for row in ctx.matrix.rows("undriven_gpus"):
        if row.uncertain or (row["cause"] == "open-kernel-module" and flavor):
            continue
        below = Version.maybe(row.get("below_cc"))
        if below is None:
            causes.append(row)
            continue
        older = [info for _, info in physical if _below(info, below)]
        if older and len(physical) - len(older) <= count:
            causes.insert(0, row)  # the GPUs it leaves out account for the missing ones
            left_out += older
    if not causes or (flavor == "open" and _open_leaves_out(ctx, physical, count)):
        return []  # the open flavor leaves those out: rules_kernel_module names them
    names = ", ".join(info.label for _, info in physical)
    lead = causes[0]
    if left_out:
        who = ", ".join(f"{g.label} (cc {g.cc})" for g in left_out)
        msg = (f"the driver lists {count} of the {len(physical)} GPUs named ({names}); "
               f"{who} may be the one left out: {lead['what']}")
    else:
        msg = (f"the driver lists {count} of the {len(physical)} GPUs named ({names}): some "
               f"GPU is not driven — {lead['what']}")
    checks = "; ".join(dict.fromkeys(r["check"] for r in causes))
    fixes = "; or ".join(r["fix"] for r in causes)
    return [finding("gpu-not-driven", "error", "gpu", msg,
                    fix=f"check which: {checks}. Then {fixes}",
                    source=cite(*causes),
                    gpu_count=count, gpus_named=len(physical),
                    left_out=[g.label for g in left_out] or None)]


def _open_leaves_out(ctx: Context, physical: list, count: int) -> bool:
    """The GPUs the open kernel module does not drive account for the missing ones."""
    row = ctx.matrix.kernel_flavor("open")
    floor = Version.maybe(row.get("min_cc")) if row else None
    gone = [i for _, i in physical if floor is not None and _below(i, floor)]
    return bool(gone) and len(physical) - len(gone) <= count


def _count(value: object) -> int | None:
    try:
        return int(str(value).strip()) if value is not None else None
    except ValueError:
        return None


def _below(info: GpuInfo, cc: Version) -> bool:
    return info.cc is not None and (info.cc.major, info.cc.minor) < (cc.major, cc.minor)
