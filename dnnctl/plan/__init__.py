"""Plans: the ``dnnctl-plan/1`` schema, YAML I/O, validation, and run-time lookup.

Run time: :func:`load_plan` returns a :class:`LoadedPlan` whose ``lookup`` the dispatcher
calls for every op call (a dict lookup when the key was tuned).
"""

from __future__ import annotations

from dnnctl.plan.digest import kernels_digest
from dnnctl.plan.io import parse_plan, plan_text, read_plan, update_plan, write_plan
from dnnctl.plan.loaded import LoadedPlan, PlanStats, StalePlanWarning, load_plan
from dnnctl.plan.schema import SCHEMA, Alternative, Plan, PlanEntry, Section, Timing
from dnnctl.plan.support import UnsupportedEntryWarning

__all__ = [
    "SCHEMA", "Alternative", "LoadedPlan", "Plan", "PlanEntry", "PlanStats", "Section",
    "StalePlanWarning", "Timing", "UnsupportedEntryWarning", "kernels_digest", "load_plan", "parse_plan", "plan_text",
    "read_plan", "update_plan", "write_plan",
]
