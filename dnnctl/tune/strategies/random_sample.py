"""Random sampling: the default heuristic, then a seeded random subset of the rest."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dnnctl.tune.candidates import Candidate, Space
from dnnctl.tune.results import Result
from dnnctl.tune.strategies.base import Strategy


class RandomSample(Strategy):
    name = "random"
    doc = ("the default, then a random quarter of the space (at least 8; --max-evals to "
           "change); reproducible for a given --seed")

    def limit(self, space: Space) -> int:
        if self.max_evals is not None:
            return min(self.max_evals, len(space))
        return min(len(space), max(8, math.ceil(0.25 * len(space))))

    def propose(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        if space.default is not None and space.default in space.order() and \
                space.default not in results:
            return space.default
        rng = np.random.default_rng(self.problem_seed(space))
        for i in rng.permutation(len(space.candidates)):
            cand = space.candidates[int(i)]
            if cand not in results:
                return cand
        return None
