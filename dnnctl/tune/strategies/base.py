"""The search-strategy interface: given the space and the results so far, what next?"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from dnnctl.tune.candidates import Candidate, Space
from dnnctl.tune.results import Result


class Strategy(ABC):
    """Proposes candidates one at a time; the tuner evaluates them and asks again.

    Strategies never time anything themselves, so they are tested by replaying recorded
    results. ``max_evals`` caps the candidates evaluated per problem (None: the strategy's
    own default); the tuner's time budget may stop the search earlier.
    """

    name: ClassVar[str]
    doc: ClassVar[str] = ""

    def __init__(self, seed: int = 0, max_evals: int | None = None):
        self.seed = seed
        self.max_evals = max_evals

    def limit(self, space: Space) -> int:
        """How many candidates this strategy evaluates at most for ``space``."""
        return len(space) if self.max_evals is None else min(self.max_evals, len(space))

    def next(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        """The next candidate to evaluate, or None when the search is over."""
        evaluated = sum(1 for c in space.candidates if c in results)
        if evaluated >= self.limit(space):
            return None
        return self.propose(space, results)

    @abstractmethod
    def propose(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        """A candidate of ``space`` not in ``results`` yet, or None to stop."""

    def upcoming(self, space: Space, results: Mapping[Candidate, Result], n: int
                 ) -> list[Candidate]:
        """The next ``n`` candidates this strategy will probably propose (to compile them
        ahead). The default replays :meth:`next` as if each proposal had failed, which is
        exact for strategies whose order does not depend on the timings."""
        shadow = dict(results)
        out: list[Candidate] = []
        while len(out) < n:
            cand = self.next(space, shadow)
            if cand is None:
                break
            out.append(cand)
            shadow[cand] = Result(cand, "crashed")
        return out

    def problem_seed(self, space: Space) -> int:
        """A seed from the run seed and the problem, stable across processes and runs."""
        digest = hashlib.sha256(f"{self.seed}:{space.problem.short()}".encode()).digest()
        return int.from_bytes(digest[:8], "little")
