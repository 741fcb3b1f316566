"""What a tuning run returns: per-problem outcomes and the run's summary; progress events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnnctl.errors import DnnctlError, ExitCode
from dnnctl.ops.base import Problem
from dnnctl.plan.schema import FAIL_REASONS, PlanEntry

# planned: tuned now; pinned: a pinned plan entry was kept; kept: already in the plan
# (--resume); unplanned: no candidate passed verification (or none supports the shape)
OUTCOMES: tuple[str, ...] = ("planned", "pinned", "kept", "unplanned")


@dataclass
class ProblemOutcome:
    problem: Problem
    count: int
    status: str
    entry: PlanEntry | None = None
    tried: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why not a candidate
    space: int = 0  # candidates in the search space
    detail: str = ""
    elapsed_s: float = 0.0
    device: int | None = None
    slot: int | None = None  # which worker (several per run with --devices)
    partial: bool = False  # the --budget cut its search short (entry.compared says how far)

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        out: dict[str, Any] = {
            "op": self.problem.op, "key": self.problem.as_dict(), "count": self.count,
            "status": self.status, "space": self.space, "tried": self.tried,
            "failed": {r: self.failed.get(r, 0) for r in FAIL_REASONS},
            "skipped": dict(self.skipped), "elapsed_s": round(self.elapsed_s, 3),
            "device": self.device, "slot": self.slot, "detail": self.detail,
            "partial": self.partial,
        }
        if e is not None:
            out["winner"] = {"variant": e.choice.variant, "params": e.choice.param_dict}
            out["median_us"] = e.stats.median_us if e.stats else None
            out["default"] = None if e.default is None else {
                "variant": e.default.choice.variant, "params": e.default.choice.param_dict,
                "median_us": e.default.median_us}
            out["runner_up"] = None if e.runner_up is None else {
                "variant": e.runner_up.choice.variant, "params": e.runner_up.choice.param_dict,
                "median_us": e.runner_up.median_us}
            out["speedup_vs_default"] = e.speedup_vs_default()
            out["speedup_vs_runner_up"] = e.speedup_vs_runner_up()
            if e.partial:
                out["compared"] = e.compared
            if e.tie:
                out["tie"] = list(e.tie)
        return out


@dataclass
class TuneReport:
    plan_path: str
    journal_path: str
    backend: str
    devices: list[int]
    device: dict[str, Any]
    workload: str
    strategy: str
    outcomes: list[ProblemOutcome]
    elapsed_s: float
    policy: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    prebuilt: int = 0  # candidates compiled ahead by build helpers

    @property
    def partial(self) -> list[ProblemOutcome]:
        """Problems the --budget cut short (planned from fewer candidates)."""
        return [o for o in self.outcomes if o.partial]

    @property
    def unplanned(self) -> list[ProblemOutcome]:
        return [o for o in self.outcomes if o.status == "unplanned"]

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(1 for o in self.outcomes if o.status == s) for s in OUTCOMES}
        counts["partial"] = len(self.partial)
        return {"schema": "dnnctl-tune/1", "plan": self.plan_path, "journal": self.journal_path,
                "backend": self.backend, "devices": self.devices, "device": self.device,
                "workload": self.workload, "strategy": self.strategy,
                "elapsed_s": round(self.elapsed_s, 3), "counts": counts,
                "policy": self.policy, "notes": self.notes, "prebuilt": self.prebuilt,
                "problems": [o.to_dict() for o in self.outcomes]}


@dataclass
class Event:
    """A progress event for the CLI: ``kind`` is start, problem, candidate, retime,
    problem_done or finish."""

    kind: str
    data: dict[str, Any]


Progress = Callable[[Event], None]


class TuneInterrupted(DnnctlError):
    """Ctrl-C during tuning: the journal keeps every measured candidate."""

    code = "interrupted"
    exit_code = ExitCode.INTERRUPTED
