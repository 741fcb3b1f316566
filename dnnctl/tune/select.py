"""Choosing the winner: fastest median, but a win smaller than the measured noise is a tie,
broken by the fixed preference order, so the same machine gives the same plan.

Noise is measured, not assumed: the leaders are re-timed in interleaved rounds and the
spread of a candidate is the range of its per-round medians (how far its median moves when
measured again). Without rounds it is half the p20-p80 range of its samples. A candidate
ties with the fastest when its median is within the larger of the two spreads, bounded
below by ``tie_floor`` and above by ``tie_cap`` (fractions of the fastest median): tiny
"wins" never flip a plan, and a noisy slow candidate never wins by its noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dnnctl.plan.schema import Timing
from dnnctl.tune.candidates import Candidate
from dnnctl.tune.results import Result


@dataclass(frozen=True)
class Retimed:
    """A leader's re-timing: all samples of all rounds, and each round's median."""

    candidate: Candidate
    timing: Timing
    round_medians: tuple[float, ...] = ()

    @property
    def half_range(self) -> float:
        return (self.timing.p80_us - self.timing.p20_us) / 2

    @property
    def spread(self) -> float:
        if len(self.round_medians) >= 2:
            return max(self.round_medians) - min(self.round_medians)
        return (self.timing.p80_us - self.timing.p20_us) / 2


@dataclass
class Decision:
    winner: Candidate
    timing: Timing
    runner_up: tuple[Candidate, float] | None
    default: tuple[Candidate, float] | None
    tied: list[Candidate] = field(default_factory=list)
    retimed: bool = False


def leaders(results: Mapping[Candidate, Result], top: int, default: Candidate | None,
            eligible: set[Candidate] | None = None) -> list[Candidate]:
    """The ``top`` fastest eligible candidates, plus the default heuristic when it ran."""
    ok = sorted((r for r in results.values() if r.ok and _eligible(r.candidate, eligible)),
                key=lambda r: r.score)
    out = [r.candidate for r in ok[:top]]
    if default is not None and default not in out and default in results and \
            results[default].ok:
        out.append(default)
    return out


def decide(results: Mapping[Candidate, Result], order: Mapping[Candidate, int], *,
           retimed: Mapping[Candidate, Retimed] | None = None,
           default: Candidate | None = None, eligible: set[Candidate] | None = None,
           tie_floor: float = 0.01, tie_cap: float = 0.03) -> Decision | None:
    """The winner among eligible verified candidates (None when none passed)."""
    ok = {c: r for c, r in results.items() if r.ok and _eligible(c, eligible)}
    if not ok:
        return None
    measured: dict[Candidate, Retimed] = {}
    use_retime = bool(retimed) and any(c in ok for c in retimed or {})
    if use_retime:
        for c, rt in (retimed or {}).items():
            if c in ok:
                measured[c] = rt
    else:
        for c, r in ok.items():
            assert r.timing is not None
            measured[c] = Retimed(c, r.timing)
    best = min(measured.values(), key=lambda m: (m.timing.median_us, _rank(order, m.candidate)))
    base = best.timing.median_us
    tied = [m.candidate for m in measured.values()
            if m.timing.median_us - base <= tie_window(best, m, base, tie_floor, tie_cap)]
    winner = min(tied, key=lambda c: _rank(order, c))
    others = sorted((m for m in measured.values() if m.candidate != winner),
                    key=lambda m: (m.timing.median_us, _rank(order, m.candidate)))
    runner: tuple[Candidate, float] | None = None
    if others:
        runner = (others[0].candidate, others[0].timing.median_us)
    else:
        rest = sorted((r for c, r in results.items() if r.ok and c != winner),
                      key=lambda r: (r.score, _rank(order, r.candidate)))
        if rest:
            runner = (rest[0].candidate, rest[0].score)
    dflt: tuple[Candidate, float] | None = None
    if default is not None:
        if default in measured:
            dflt = (default, measured[default].timing.median_us)
        elif default in results and results[default].ok:
            dflt = (default, results[default].score)
    return Decision(winner, measured[winner].timing, runner, dflt,
                    sorted(tied, key=lambda c: _rank(order, c)), use_retime)


def tie_window(best: Retimed, other: Retimed, base: float, floor: float, cap: float) -> float:
    """How much slower than ``best`` ``other`` may be and still tie (us): the larger of the
    two candidates' measured noise, where the noise of one is the wider of how far its
    median moved between rounds and half its p20-p80 range (the interval a re-measurement
    of its median lands in); bounded by ``floor`` and ``cap``."""
    noise = max(best.spread, other.spread, best.half_range, other.half_range)
    return max(floor * base, min(noise, cap * base))


def _eligible(c: Candidate, eligible: set[Candidate] | None) -> bool:
    return eligible is None or c in eligible


def _rank(order: Mapping[Candidate, int], c: Candidate) -> int:
    return order.get(c, len(order))


def combine_rounds(candidate: Candidate, rounds: Sequence[Sequence[float]]) -> Retimed:
    """A :class:`Retimed` from per-round sample lists."""
    from dnnctl.tune.timer import summarize

    flat = [s for r in rounds for s in r]
    medians = tuple(summarize(r).median_us for r in rounds if len(r))
    return Retimed(candidate, summarize(flat), medians)
