"""Time left in a tuning run, estimated from the tuner's progress events.

The ETA comes from the measured wall time per candidate so far, times the candidates left:
those of the problems being measured, plus, for problems not started yet, the mean number
of candidates per problem seen so far.
"""

from __future__ import annotations

import time
from typing import Any


class Eta:
    """Candidates done and left, and the measured seconds per candidate."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.problems = self.finished = 0
        self.done = 0  # candidates measured
        self.current: dict[Any, tuple[int, int]] = {}  # device -> (done, total)
        self.finished_candidates = 0

    def seconds_left(self, slots: int = 1) -> float | None:
        if self.done == 0:
            return None
        per = (time.monotonic() - self.t0) / self.done
        in_flight = sum(max(0, t - d) for d, t in self.current.values())
        started = self.finished + len(self.current)
        mean = (self.finished_candidates + sum(t for _, t in self.current.values())) / max(
            started, 1)
        future = max(0, self.problems - started) * mean
        return (in_flight + future) * per / max(1, slots)


def track(eta: Eta, event: Any) -> None:
    """Update the ETA model from one tuner event."""
    d = event.data
    if event.kind == "start":
        eta.problems = int(d["problems"])
    elif event.kind == "problem":
        if not eta.done and not eta.current:  # the clock starts with the first problem,
            eta.t0 = time.monotonic()  # not with worker start-up
        eta.current[d["device"]] = (0, int(d["candidates"]))
    elif event.kind == "candidate":
        eta.done += 1
        eta.current[d["device"]] = (int(d["done"]), int(d["total"]))
    elif event.kind == "problem_done":
        eta.finished += 1
        done, _ = eta.current.pop(d.get("device"), (0, 0))
        eta.finished_candidates += done
