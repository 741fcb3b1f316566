"""Which problems of a workload a plan serves exactly, by a nearest entry, or not at all."""

from __future__ import annotations

from typing import Any

from dnnctl.plan.loaded import LoadedPlan
from dnnctl.plan.schema import Plan
from dnnctl.plan.sections import pick_section, section_device
from dnnctl.workloads.model import Workload


def coverage(plan: Plan, workload: Workload, section: int | None = None,
             device: str | None = None) -> dict[str, Any]:
    """Per problem: hit (exact entry), fallback (nearest usable entry) or miss (default
    heuristic), with the choice; totals weighted by the workload's counts."""
    idx, sec = pick_section(plan, section, device)
    dev = section_device(sec)
    loaded = LoadedPlan(plan)
    loaded.bind_section(sec, dev)
    rows = []
    totals = {"hit": 0, "fallback": 0, "miss": 0}
    calls = {"hit": 0, "fallback": 0, "miss": 0}
    for it in workload.items:
        outcome, choice, entry = loaded.explain(it.problem, sec.backend, dev)
        totals[outcome] += 1
        calls[outcome] += it.count
        row: dict[str, Any] = {"op": it.problem.op, "key": it.problem.as_dict(),
                               "count": it.count, "outcome": outcome,
                               "choice": choice.label() if choice else None}
        if outcome == "fallback" and entry is not None:
            row["from_key"] = entry.problem.as_dict()
        rows.append(row)
    n_calls = max(1, sum(calls.values()))
    return {"plan": plan.source, "workload": workload.name, "section": idx,
            "device": sec.label(), "problems": rows, "totals": totals, "calls": calls,
            "hit_rate": calls["hit"] / n_calls,
            "covered_rate": (calls["hit"] + calls["fallback"]) / n_calls}
