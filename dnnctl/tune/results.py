"""The result of evaluating one candidate: verified and timed, or failed with a reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dnnctl.plan.schema import FAIL_REASONS, Timing
from dnnctl.tune.candidates import Candidate

STATUSES: tuple[str, ...] = ("ok", *FAIL_REASONS)


@dataclass
class Result:
    """``status`` is ``ok`` or a failure reason (wrong, crashed, timeout, oom); a failure
    is an infinitely slow result, never an exception that ends the run."""

    candidate: Candidate
    status: str
    timing: Timing | None = None
    max_rel_err: float | None = None
    workspace_bytes: int = 0
    detail: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.timing is not None

    @property
    def score(self) -> float:
        """Median time in us; infinity for a failed candidate."""
        return self.timing.median_us if self.ok and self.timing is not None else math.inf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"variant": self.candidate.variant,
                               "params": self.candidate.param_dict, "status": self.status}
        if self.timing is not None:
            out.update(median_us=self.timing.median_us, p20_us=self.timing.p20_us,
                       p80_us=self.timing.p80_us, n=self.timing.n)
        out.update(max_rel_err=self.max_rel_err, workspace_bytes=self.workspace_bytes,
                   detail=self.detail[:2000], elapsed_s=round(self.elapsed_s, 4))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        timing = None
        if d.get("median_us") is not None:
            timing = Timing(float(d["median_us"]), float(d["p20_us"]), float(d["p80_us"]),
                            int(d["n"]))
        status = d["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        return cls(Candidate.of(d["variant"], d.get("params") or {}), status, timing,
                   d.get("max_rel_err"), int(d.get("workspace_bytes") or 0),
                   str(d.get("detail") or ""), float(d.get("elapsed_s") or 0.0))
