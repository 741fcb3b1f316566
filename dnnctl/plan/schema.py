"""The ``dnnctl-plan/1`` data model: a plan has sections (one per device fingerprint), a
section has entries (one per problem key), an entry names a variant and its parameters.

Conversion to plain data (:func:`plan_to_data`) fixes the key order and the entry order, so
a plan written twice from the same results is byte-identical and diffs stay small.
Conversion from plain data lives in :mod:`dnnctl.plan.validate`.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any

from dnnctl.files.yamlio import Flow
from dnnctl.ops.base import Choice, Problem, problem_sort_key

SCHEMA = "dnnctl-plan/1"
FAIL_REASONS: tuple[str, ...] = ("wrong", "crashed", "timeout", "oom")
DEVICE_FIELDS: tuple[str, ...] = (
    "backend", "name", "compute_capability", "sm_count", "driver", "cuda_runtime", "dnnctl")
SECTION_FIELDS: tuple[str, ...] = ("device", "kernels_digest", "created", "tuning", "entries")
ENTRY_FIELDS: tuple[str, ...] = (
    "op", "key", "choice", "stats", "runner_up", "default", "tried", "failed",
    "workspace_bytes", "max_rel_err", "pinned", "partial", "compared", "tie")
OPTIONAL_ENTRY_FIELDS: tuple[str, ...] = ("partial", "compared", "tie")  # written when set


@dataclass(frozen=True)
class Timing:
    """Per-call time statistics of one candidate, in microseconds."""

    median_us: float
    p20_us: float
    p80_us: float
    n: int

    def to_data(self) -> dict[str, Any]:
        return {"median_us": _us(self.median_us), "p20_us": _us(self.p20_us),
                "p80_us": _us(self.p80_us), "n": int(self.n)}


@dataclass(frozen=True)
class Alternative:
    """Another candidate an entry compares against (the runner-up, or the default heuristic)."""

    choice: Choice
    median_us: float | None = None

    def to_data(self, *, always_params: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"variant": self.choice.variant}
        if always_params or self.choice.params:
            out["params"] = Flow(self.choice.param_dict)
        out["median_us"] = None if self.median_us is None else _us(self.median_us)
        return out


@dataclass
class PlanEntry:
    """The tuned (or pinned) choice for one problem on one device."""

    problem: Problem
    choice: Choice
    stats: Timing | None = None
    runner_up: Alternative | None = None
    default: Alternative | None = None
    tried: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    workspace_bytes: int = 0
    max_rel_err: float | None = None
    pinned: bool = False
    # a --budget cut the search short: only ``compared`` candidates were verified and timed
    partial: bool = False
    compared: int | None = None
    # the winner was inside the measured noise of these candidates (labels, the winner
    # first); the fixed preference order chose it
    tie: tuple[str, ...] = ()

    @property
    def op(self) -> str:
        return self.problem.op

    def speedup_vs_default(self) -> float | None:
        if self.stats is None or self.default is None or not self.default.median_us:
            return None
        return self.default.median_us / self.stats.median_us if self.stats.median_us else None

    def speedup_vs_runner_up(self) -> float | None:
        if self.stats is None or self.runner_up is None or not self.runner_up.median_us:
            return None
        return self.runner_up.median_us / self.stats.median_us if self.stats.median_us else None

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.problem.op,
            "key": Flow(self.problem.as_dict()),
            "choice": Flow({"variant": self.choice.variant,
                             "params": Flow(self.choice.param_dict)}),
        }
        if self.stats is not None:
            out["stats"] = Flow(self.stats.to_data())
        if self.runner_up is not None:
            out["runner_up"] = Flow(self.runner_up.to_data())
        if self.default is not None:
            out["default"] = Flow(self.default.to_data(always_params=False))
        out["tried"] = int(self.tried)
        out["failed"] = Flow({r: int(self.failed.get(r, 0)) for r in FAIL_REASONS})
        out["workspace_bytes"] = int(self.workspace_bytes)
        out["max_rel_err"] = None if self.max_rel_err is None else _sig(self.max_rel_err)
        out["pinned"] = bool(self.pinned)
        if self.partial:
            out["partial"] = True
            out["compared"] = int(self.compared or 0)
        if self.tie:
            out["tie"] = list(self.tie)
        return out


@dataclass
class Section:
    """All entries tuned on one device (fingerprint) with one kernels digest."""

    device: dict[str, Any]
    kernels_digest: str
    created: str = ""
    tuning: dict[str, Any] = field(default_factory=dict)
    entries: list[PlanEntry] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return str(self.device.get("backend", ""))

    def label(self) -> str:
        d = self.device
        extra = f" cc {d['compute_capability']}" if d.get("compute_capability") else ""
        drv = f", driver {d['driver']}" if d.get("driver") else ""
        return f"{d.get('backend')}: {d.get('name')}{extra}{drv}"

    def find(self, problem: Problem) -> PlanEntry | None:
        for e in self.entries:
            if e.problem == problem:
                return e
        return None

    def upsert(self, entry: PlanEntry) -> None:
        """Replace the entry with the same problem, or add it."""
        for i, e in enumerate(self.entries):
            if e.problem == entry.problem:
                self.entries[i] = entry
                return
        self.entries.append(entry)

    def to_data(self) -> dict[str, Any]:
        entries = sorted(self.entries, key=lambda e: problem_sort_key(e.problem))
        return {
            "device": Flow({k: self.device.get(k) for k in DEVICE_FIELDS}),
            "kernels_digest": self.kernels_digest,
            "created": self.created,
            "tuning": Flow(dict(sorted(self.tuning.items()))),
            "entries": [e.to_data() for e in entries],
        }


@dataclass
class Plan:
    """A whole plan file: sections for one or more devices."""

    sections: list[Section] = field(default_factory=list)
    source: str = "<memory>"

    def section_for(self, device: dict[str, Any], kernels_digest: str | None = None
                    ) -> Section | None:
        """The section with exactly this fingerprint (and digest, when given)."""
        for s in self.sections:
            if same_device(s.device, device) and (
                    kernels_digest is None or s.kernels_digest == kernels_digest):
                return s
        return None

    def to_data(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "sections": [s.to_data() for s in self.sections]}


# ----------------------------------------------------------------------------- helpers


def same_device(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when two device fingerprints agree on every field a plan section records."""
    return all(_norm(a.get(k)) == _norm(b.get(k)) for k in DEVICE_FIELDS)


def device_differences(plan_dev: dict[str, Any], this_dev: dict[str, Any]) -> list[str]:
    """Human-readable 'field: plan X, here Y' for every fingerprint field that differs."""
    out = []
    for k in DEVICE_FIELDS:
        if _norm(plan_dev.get(k)) != _norm(this_dev.get(k)):
            out.append(f"{k}: plan {plan_dev.get(k)!r}, here {this_dev.get(k)!r}")
    return out


def _norm(v: Any) -> Any:
    return "" if v is None else str(v)




def _us(v: float) -> float:
    """Microseconds with 4 significant digits (enough to rank, few digits to diff)."""
    return _sig(v, 4)


def _sig(v: float, digits: int = 3) -> float:
    v = float(v)
    if v == 0.0 or not math.isfinite(v):
        return v
    return float(f"{v:.{digits}g}")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z")
