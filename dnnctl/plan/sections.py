"""Picking a section of a plan for offline tools (coverage, pin), and the device it was
made on as a :class:`DeviceInfo` (for ``supports()`` checks away from that device)."""

from __future__ import annotations

from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend, parse_device
from dnnctl.errors import UsageError
from dnnctl.plan.schema import Plan, Section, same_device

# Opt-in shared memory per block by compute capability (CUDA programming guide), used when a
# plan section is judged away from its GPU; the fingerprint does not record it.
_SMEM_OPTIN: dict[str, int] = {
    "7.0": 98304, "7.5": 65536, "8.0": 166912, "8.6": 101376, "8.7": 166912, "8.9": 101376,
    "9.0": 232448, "10.0": 232448, "10.3": 232448, "12.0": 101376,
}


def this_device(spec: str | None = None) -> DeviceInfo | None:
    """The best (or named) device of this machine, or None if its backend is unusable."""
    name, index = parse_device(spec)
    backend = get_backend(name)
    if not backend.availability()[0]:
        return None
    return backend.device(index)


def pick_section(plan: Plan, index: int | None = None, device: str | None = None
                 ) -> tuple[int, Section]:
    """Section ``index``; else the only one; else the one made on this machine's device."""
    if not plan.sections:
        raise UsageError(f"{plan.source} has no sections", hint="tune first: dnnctl tune")
    if index is not None:
        if not 0 <= index < len(plan.sections):
            raise UsageError(f"{plan.source} has {len(plan.sections)} section(s); "
                             f"--section {index} does not exist",
                             hint="'dnnctl plan show' lists them from 0")
        return index, plan.sections[index]
    if len(plan.sections) == 1:
        return 0, plan.sections[0]
    here = this_device(device)
    if here is not None:
        fp = here.fingerprint()
        for i, s in enumerate(plan.sections):
            if same_device(s.device, fp):
                return i, s
    labels = "; ".join(f"{i}: {s.label()}" for i, s in enumerate(plan.sections))
    raise UsageError(f"{plan.source} has several sections and none is this machine's",
                     hint=f"choose one with --section N ({labels})")


def section_device(section: Section, index: int = 0) -> DeviceInfo:
    """The section's device as a DeviceInfo; the real one when it is this machine's."""
    d: dict[str, Any] = section.device
    here = this_device("cpu" if d.get("backend") == "numpy" else None)
    if here is not None and same_device(d, here.fingerprint()):
        return here
    return DeviceInfo(
        backend=str(d.get("backend")), index=index, name=str(d.get("name")),
        compute_capability=str(d.get("compute_capability") or ""),
        sm_count=int(d.get("sm_count") or 0), driver=str(d.get("driver") or ""),
        cuda_runtime=str(d.get("cuda_runtime") or ""),
        smem_per_block_optin=_SMEM_OPTIN.get(str(d.get("compute_capability")), 0))
