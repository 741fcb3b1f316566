"""Pinning: mark plan entries so re-tuning keeps them, optionally choosing the variant."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dnnctl.errors import UnsupportedError, UsageError
from dnnctl.ops import registry
from dnnctl.plan.io import update_plan
from dnnctl.plan.schema import Plan, PlanEntry
from dnnctl.plan.sections import pick_section, section_device
from dnnctl.plan.validate import check_choice


def pin(path: str | os.PathLike[str], op: str | None = None,
        key: Mapping[str, Any] | None = None, *, variant: str | None = None,
        params: Mapping[str, Any] | None = None, unpin: bool = False, all_entries: bool = False,
        section: int | None = None) -> dict[str, Any]:
    """Pin (or unpin) one entry, or every entry of a section; returns what changed.

    With ``variant`` the entry's choice is set (validated against the registry and the
    section's device; its timings are cleared since they belonged to the old choice); a key
    the plan does not have yet gets a new pinned entry.
    """
    if all_entries == (op is not None):
        raise UsageError("give either --op/--key for one entry or --all",
                         hint="dnnctl plan pin plan.yaml --op conv2d --key n=1,c=64,...")
    changed: list[dict[str, Any]] = []

    def change(plan: Plan) -> None:
        idx, sec = pick_section(plan, section)
        if all_entries:
            if variant is not None:
                raise UsageError("--variant needs one entry (--op/--key), not --all")
            for e in sec.entries:
                if e.pinned == unpin:
                    e.pinned = not unpin
                    changed.append(_row(e, idx))
            return
        assert op is not None
        problem = registry.get_op(op).problem(dict(key or {}))
        entry = sec.find(problem)
        if variant is not None:
            choice = check_choice(problem, sec.backend, variant, dict(params or {}))
            dev = section_device(sec)
            v = registry.get_variant(problem.op, sec.backend, variant)
            support = v.supports(problem, dev)
            if not support:
                raise UnsupportedError(f"{problem.op}/{variant} does not support "
                                       f"{problem.short()}: {support.reason}")
            if not v.valid_params(problem, choice.param_dict, dev):
                raise UsageError(f"parameters {choice.param_dict} of {variant} are not valid "
                                 f"for {problem.short()}")
            if entry is None:
                entry = PlanEntry(problem, choice)
                sec.entries.append(entry)
            elif entry.choice != choice:
                entry.choice, entry.stats, entry.runner_up = choice, None, None
                entry.max_rel_err, entry.workspace_bytes = None, v.workspace_bytes(
                    problem, choice.param_dict)
        elif entry is None:
            raise UsageError(f"the plan has no entry for {problem.short()} in section {idx}",
                             hint="give --variant (and --param) to pin a choice for it")
        entry.pinned = not unpin
        changed.append(_row(entry, idx))

    update_plan(path, change)
    return {"plan": str(path), "changed": changed}


def _row(e: PlanEntry, section: int) -> dict[str, Any]:
    return {"section": section, "op": e.problem.op, "key": e.problem.as_dict(),
            "choice": e.choice.label(), "pinned": e.pinned}
