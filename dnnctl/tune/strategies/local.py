"""Local search (greedy hill climbing) over each variant's parameter grid.

Start at the default heuristic; the neighbours of a candidate are the vendor libraries'
variants (measured first: the bar a plan must clear), the same variant with one parameter
moved to the adjacent value of its declared list, and every other variant at its own default
parameters (``default_params``, else its first valid parameter set). Evaluate every
neighbour of the best candidate so far; stop when the best has no unevaluated neighbour.
Deterministic; good for large parameter spaces where the fast region is connected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import registry
from dnnctl.tune.candidates import Candidate, Space
from dnnctl.tune.results import Result
from dnnctl.tune.strategies.base import Strategy


class LocalSearch(Strategy):
    name = "local"
    doc = "greedy hill climbing from the default over neighbouring parameter values"

    def propose(self, space: Space, results: Mapping[Candidate, Result]) -> Candidate | None:
        if not space.candidates:
            return None
        start = space.default if space.default in space.order() else space.candidates[0]
        if start not in results:
            return start
        ok = [r for c, r in results.items() if r.ok and c in space.order()]
        best = min(ok, key=lambda r: r.score).candidate if ok else start
        for cand in neighbours(best, space):
            if cand not in results:
                return cand
        if not ok:  # nothing works yet: keep walking in preference order
            return next((c for c in space.candidates if c not in results), None)
        return None


    def upcoming(self, space: Space, results: Mapping[Candidate, Result], n: int
                 ) -> list[Candidate]:
        """The unevaluated neighbours of the best candidate so far (what it asks next)."""
        if not space.candidates:
            return []
        start = space.default if space.default in space.order() else space.candidates[0]
        ok = [r for c, r in results.items() if r.ok and c in space.order()]
        best = min(ok, key=lambda r: r.score).candidate if ok else start
        out = [c for c in [start, *neighbours(best, space)] if c not in results]
        return list(dict.fromkeys(out))[:n]


def neighbours(cand: Candidate, space: Space) -> list[Candidate]:
    """Neighbours of ``cand`` that are in ``space``, in a fixed order."""
    present = space.order()
    out: list[Candidate] = []
    seen = {cand.variant}
    for other in space.candidates:  # the libraries first, from their own defaults
        if other.variant in space.vendors and other.variant not in seen:
            seen.add(other.variant)
            out.append(space.starts.get(other.variant) or other)
    declared = _declared(space.problem.op, cand.variant)
    params = cand.param_dict
    for name, values in declared.items():
        if name not in params or params[name] not in values:
            continue
        i = values.index(params[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                moved = Candidate.of(cand.variant, {**params, name: values[j]})
                if moved in present:
                    out.append(moved)
    for other in space.candidates:  # every other variant, from its own default parameters
        if other.variant not in seen:
            seen.add(other.variant)
            out.append(space.starts.get(other.variant) or other)
    return out


def _declared(op: str, variant: str) -> dict[str, tuple[Any, ...]]:
    for v in registry.variants(op):
        if v.name == variant:
            return dict(v.params)
    return {}
