"""Exhaustive search: every candidate, in preference order (default heuristic first)."""

from __future__ import annotations

from collections.abc import Mapping

from dnnctl.tune.candidates import Candidate, Space
from dnnctl.tune.results import Result
from dnnctl.tune.strategies.base import Strategy


class Exhaustive(Strategy):
    name = "exhaustive"
    doc = "every supported candidate (default); the time budget may cut it short"

    def propose(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        return next((c for c in space.candidates if c not in results), None)
