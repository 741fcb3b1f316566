"""Does each plan entry's variant really support its key? (``supports()`` + parameters)

An exact plan hit skips the search, so an entry whose variant cannot run its shape (a hand
edit, a merge from another dnnctl version, a tile the shape no longer allows) must be caught
before any call: ``plan validate`` rejects it, ``load_plan`` ignores it with a warning
naming it, and the call falls back to the nearest entry or the default heuristic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dnnctl.errors import PlanError
from dnnctl.files import gcpause
from dnnctl.ops import registry
from dnnctl.plan.schema import Plan, PlanEntry, Section


class UnsupportedEntryWarning(UserWarning):
    """A plan entry's variant does not support its key on this device; it is not used."""


def why_unsupported(entry: PlanEntry, backend: str, device: Any) -> str | None:
    """None when the entry's variant supports its key and parameters on ``device``."""
    try:
        variant = registry.get_variant(entry.problem.op, backend, entry.choice.variant)
        ok = variant.supports(entry.problem, device)
        if not ok:
            return getattr(ok, "reason", "") or "not supported"
        if not variant.valid_params(entry.problem, entry.choice.param_dict, device):
            return f"parameters {entry.choice.param_dict} are not valid for this shape"
    except Exception as exc:  # noqa: BLE001 - a variant that cannot judge: not usable
        return f"the variant could not judge the key ({type(exc).__name__}: {exc})"
    return None


def unsupported(section: Section, device: Any) -> Iterator[tuple[int, PlanEntry, str]]:
    """(index, entry, reason) for every entry of ``section`` not supported on ``device``."""
    for i, e in enumerate(section.entries):
        reason = why_unsupported(e, section.backend, device)
        if reason is not None:
            yield i, e, reason


def entry_label(index: int, entry: PlanEntry) -> str:
    return f"entry {index} ({entry.problem.short()}, {entry.choice.label()})"


def check_plan_support(plan: Plan) -> None:
    """Raise PlanError for the first entry whose variant does not support its key, judged
    on the section's own device (this machine's when it is the one)."""
    from dnnctl.plan.sections import section_device

    for si, section in enumerate(plan.sections):
        device = section_device(section, 0)
        with gcpause.paused():
            first = next(unsupported(section, device), None)
        if first is not None:
            i, e, reason = first
            raise PlanError(plan.source, f"{e.choice.variant} does not support this key: "
                            f"{reason}", "remove or re-tune the entry ('dnnctl tune' only "
                            "writes supported choices)",
                            where=f"sections[{si}] {entry_label(i, e)}, field 'choice'")
