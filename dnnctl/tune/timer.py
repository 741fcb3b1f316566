"""Timing policy and statistics.

Samples come from ``Backend.time`` (CUDA events around each call with the L2 flushed before
it on the GPU; wall clock on the CPU) after a time-based warm-up, as many as fit in a budget:
what an eager caller waits for, or with ``host_ahead`` the GPU's time alone (graph replay).
A candidate's result is the median with p20 / p80 and the sample count; the re-timing of
the leaders also keeps the median of every interleaved round, whose spread is the noise a
win must beat (see :mod:`dnnctl.tune.select`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from dnnctl.backends.base import Backend
from dnnctl.errors import UsageError
from dnnctl.plan.timing import TIMING_HARNESS_VERSION, summarize

__all__ = ["TIMING_HARNESS_VERSION", "TimingPolicy", "measure", "summarize"]


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often each candidate is measured."""

    warmup_ms: float = 10.0  # time-based warm-up before the samples
    budget_ms: float = 50.0  # sampling time per candidate in the first pass
    min_samples: int = 5
    max_samples: int = 2000
    l2_flush: bool = True
    retime_top: int = 3  # leaders re-timed interleaved (the default heuristic joins them)
    retime_rounds: int = 5
    retime_budget_ms: float = 20.0  # per leader per round
    tie_floor: float = 0.01  # wins below this fraction of the best time are always ties
    tie_cap: float = 0.03  # wins above this fraction are never ties, however noisy
    # GPU time alone (the host enqueues ahead: Backend.time): for plans replayed from CUDA
    # graphs (torch.compile mode="reduce-overhead", torch.cuda.graph), which pay no host
    # time per call; off, a sample is what an eager caller waits for
    host_ahead: bool = False

    @classmethod
    def for_backend(cls, backend: str) -> TimingPolicy:
        """Defaults per backend: CPU calls are slower and noisier, so fewer, shorter rounds.

        On a shared CPU, timings drift between runs by more than the spread within a run,
        so wins below 5% are always ties and the measured noise may widen the tie window
        up to 25%: two CPU tunes then agree (the preference order, default heuristic first,
        decides), at the price of a CPU choice up to that much slower than the fastest. The
        GPU keeps 1% / 3%."""
        if backend == "numpy":
            return cls(warmup_ms=3.0, budget_ms=20.0, min_samples=3, max_samples=500,
                       retime_top=3, retime_rounds=3, retime_budget_ms=10.0, tie_floor=0.05,
                       tie_cap=0.25)
        return cls()

    def replace(self, **changes: Any) -> TimingPolicy:
        data = asdict(self)
        for k, v in changes.items():
            if v is not None:
                data[k] = v
        return TimingPolicy.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimingPolicy:
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UsageError(f"unknown timing setting(s) {unknown}",
                             hint=f"known: {', '.join(known)}")
        out = cls(**data)
        if out.warmup_ms < 0 or out.budget_ms <= 0 or out.retime_budget_ms <= 0:
            raise UsageError("timing budgets must be positive (warm-up may be 0)")
        if out.min_samples < 1 or out.max_samples < out.min_samples:
            raise UsageError("need 1 <= min_samples <= max_samples")
        if out.retime_top < 0 or out.retime_rounds < 0:
            raise UsageError("retime_top / retime_rounds must be >= 0")
        if not 0 <= out.tie_floor <= out.tie_cap < 1:
            raise UsageError("need 0 <= tie_floor <= tie_cap < 1")
        return out

    def plan_metadata(self) -> dict[str, Any]:
        """What a plan section's ``tuning`` records about how its entries were measured."""
        return {"warmup_ms": self.warmup_ms, "budget_ms": self.budget_ms, "statistic": "median",
                "l2_flush": self.l2_flush, "retime_top": self.retime_top,
                "retime_rounds": self.retime_rounds, "tie_floor": self.tie_floor,
                "tie_cap": self.tie_cap, "host_ahead": self.host_ahead,
                "harness": TIMING_HARNESS_VERSION}


def measure(backend: Backend, fn: Callable[[], None], policy: TimingPolicy, *,
            budget_ms: float | None = None, warmup_ms: float | None = None) -> np.ndarray:
    """Per-call samples (us) of ``fn`` under ``policy`` (the budget may be overridden)."""
    return backend.time(
        fn, warmup_ms=policy.warmup_ms if warmup_ms is None else warmup_ms,
        budget_ms=policy.budget_ms if budget_ms is None else budget_ms,
        min_samples=policy.min_samples, max_samples=policy.max_samples,
        flush_l2=policy.l2_flush, host_ahead=policy.host_ahead)
