"""The default strategy: exhaustive when the space is small, local search when it is not."""

from __future__ import annotations

from collections.abc import Mapping

from dnnctl.tune.candidates import Candidate, Space
from dnnctl.tune.results import Result
from dnnctl.tune.strategies.base import Strategy
from dnnctl.tune.strategies.exhaustive import Exhaustive
from dnnctl.tune.strategies.local import LocalSearch

SMALL_SPACE = 48


class Auto(Strategy):
    name = "auto"
    doc = (f"exhaustive up to {SMALL_SPACE} candidates, else local search from the default "
           "(large GPU parameter spaces have hundreds of candidates)")

    def _inner(self, space: Space) -> Strategy:
        inner = getattr(self, "_chosen", None)
        if inner is None:
            cls = Exhaustive if len(space) <= SMALL_SPACE else LocalSearch
            inner = cls(seed=self.seed, max_evals=self.max_evals)
            self._chosen = inner
        return inner

    def limit(self, space: Space) -> int:
        return self._inner(space).limit(space)

    def propose(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        return self._inner(space).propose(space, results)

    def upcoming(self, space: Space, results: Mapping[Candidate, Result], n: int
                 ) -> list[Candidate]:
        return self._inner(space).upcoming(space, results, n)
