"""Tuning one problem on one worker: enumerate, search, verify + time, re-time, decide."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.base import Problem
from dnnctl.plan.schema import FAIL_REASONS, Alternative, PlanEntry, Timing
from dnnctl.tune.build_ahead import BuildAhead
from dnnctl.tune.candidates import Candidate, Space, enumerate_space
from dnnctl.tune.journal import Journal, ProblemLog, problem_id
from dnnctl.tune.pool import Worker, WorkerLost
from dnnctl.tune.report import Event, ProblemOutcome
from dnnctl.tune.results import Result
from dnnctl.tune.select import Retimed, decide, leaders
from dnnctl.tune.strategies import get_strategy
from dnnctl.tune.timer import TimingPolicy


@dataclass
class Settings:
    """What every problem of a run shares."""

    backend: str
    device: DeviceInfo
    policy: TimingPolicy
    strategy: str
    max_evals: int | None
    seed: int
    deterministic: bool
    candidate_timeout_s: float
    prepare_timeout_s: float


class _PrepareFailed(Exception):
    pass


class ProblemTuner:
    """Runs one problem to a decision on one worker, journaling every result."""

    def __init__(self, settings: Settings, worker: Worker, slot: int, journal: Journal,
                 emit: Callable[[Event], None], stop: Callable[[], bool],
                 ahead: BuildAhead | None = None):
        self.s = settings
        self.worker = worker
        self.ahead = ahead
        self.slot = slot
        self.journal = journal
        self.emit = emit
        self.stop = stop

    def run(self, problem: Problem, count: int, log: ProblemLog, deadline: float,
            wall: float = float("inf")) -> ProblemOutcome:
        """Tune ``problem``. ``deadline``: its share of the budget (the search stops there
        once a candidate passed); ``wall``: the run's hard end (nothing new starts after
        it, so the run ends within one measurement of it)."""
        t0 = time.monotonic()
        s = self.s
        space = enumerate_space(problem, s.backend, s.device, deterministic=s.deterministic)
        out = ProblemOutcome(problem, count, "unplanned", skipped=dict(space.skipped),
                             space=len(space), device=self.worker.device, slot=self.slot)
        self.emit(Event("problem", {"problem": problem, "candidates": len(space),
                                    "device": self.worker.device}))
        if not space.candidates:
            reasons = "; ".join(f"{v}: {r}" for v, r in space.skipped.items())
            out.detail = f"no candidate supports this problem ({reasons or 'no variants'})"
            return self._finish(out, t0)
        results: dict[Candidate, Result] = dict(log.results)
        eligible = set(space.candidates)
        try:
            cut = self._search(problem, space, results, eligible, deadline, wall)
            retimed = log.retimed if log.retimed is not None and set(log.retimed) == set(
                leaders(results, s.policy.retime_top, space.default, eligible)) else None
            if retimed is None and not self.stop() and time.monotonic() < wall:
                retimed = self._retime(problem, space, results, eligible)
        except _PrepareFailed as exc:
            out.detail = f"could not prepare inputs / reference: {exc}"
            self._tally(out, space, results)
            return self._finish(out, t0)
        self._tally(out, space, results)
        decision = decide(results, space.order(), retimed=retimed, default=space.default,
                          eligible=eligible, tie_floor=s.policy.tie_floor,
                          tie_cap=s.policy.tie_cap)
        if decision is None:
            fails = ", ".join(f"{n} {r}" for r, n in out.failed.items() if n)
            out.detail = f"no candidate passed ({fails or 'none evaluated'})"
            if cut:
                out.detail = (f"the --budget ran out before a candidate passed "
                              f"({out.tried} tried)")
            if self.stop():
                out.detail = "interrupted"
            return self._finish(out, t0)
        win = results[decision.winner]
        compared = sum(1 for c, r in results.items() if r.ok and c in eligible)
        entry = PlanEntry(
            problem=problem, choice=decision.winner.choice, stats=decision.timing,
            runner_up=None if decision.runner_up is None else Alternative(
                decision.runner_up[0].choice, decision.runner_up[1]),
            default=None if decision.default is None else Alternative(
                decision.default[0].choice, decision.default[1]),
            tried=out.tried, failed=dict(out.failed),
            workspace_bytes=space.workspace.get(decision.winner, win.workspace_bytes),
            max_rel_err=win.max_rel_err, partial=cut, compared=compared if cut else None,
            tie=tuple(c.label() for c in decision.tied) if len(decision.tied) > 1 else ())
        out.status, out.entry, out.partial = "planned", entry, cut
        if cut:
            out.detail = (f"partial: the --budget ran out after {compared} of "
                          f"{len(space)} candidates were compared")
        self.journal.done(problem, {"status": "planned", "entry": entry.to_data()})
        return self._finish(out, t0)

    # ------------------------------------------------------------------ steps

    def _search(self, problem: Problem, space: Space, results: dict[Candidate, Result],
                eligible: set[Candidate], deadline: float, wall: float) -> bool:
        """Evaluate candidates until the strategy is done (False) or the budget cut the
        search short (True)."""
        s = self.s
        strategy = get_strategy(s.strategy, seed=s.seed, max_evals=s.max_evals)
        default = space.default
        if default is not None and default not in eligible and default not in results \
                and time.monotonic() < wall:
            # excluded from the search (e.g. --deterministic) but still the baseline
            self._evaluate(problem, default, results, space)
        done = sum(1 for c in space.candidates if c in results)
        if self.ahead is not None:
            self.ahead.next_problem()
        while not self.stop():
            cand = strategy.next(space, results)
            if cand is None:
                break
            if self.ahead is not None:
                self.ahead.submit(problem, strategy.upcoming(
                    space, results, 2 * len(self.ahead.workers) + 1))
            have_ok = any(r.ok for c, r in results.items() if c in eligible)
            now = time.monotonic()
            if now >= wall or (have_ok and now > deadline):
                return True
            self._evaluate(problem, cand, results, space)
            done += 1
            if cand in results:
                self.emit(Event("candidate", {"problem": problem, "result": results[cand],
                                              "done": done, "total": strategy.limit(space),
                                              "device": self.worker.device}))
        return False

    def _evaluate(self, problem: Problem, cand: Candidate, results: dict[Candidate, Result],
                  space: Space) -> None:
        t0 = time.monotonic()
        msg = {"cmd": "eval", "op": problem.op, "key": problem.as_dict(),
               "variant": cand.variant, "params": cand.param_dict,
               "policy": self.s.policy.to_dict()}
        try:
            self._prepare(problem)
            reply = self.worker.request(msg, self.s.candidate_timeout_s)
        except WorkerLost as exc:
            res = Result(cand, exc.status, workspace_bytes=space.workspace.get(cand, 0),
                         detail=exc.detail, elapsed_s=time.monotonic() - t0)
        else:
            res = _result(cand, reply, time.monotonic() - t0)
        if self.stop() and res.status in ("crashed", "timeout"):
            return  # killed by our own shutdown: not the candidate's fault, not journaled
        results[cand] = res
        self.journal.result(problem, res, self.worker.device)

    def _prepare(self, problem: Problem) -> None:
        pid = problem_id(problem)
        if self.worker.prepared == pid and self.worker.proc is not None and \
                self.worker.proc.poll() is None:
            return
        msg = {"cmd": "prepare", "op": problem.op, "key": problem.as_dict(),
               "seed": _seed(self.s.seed, pid)}
        try:
            reply = self.worker.request(msg, self.s.prepare_timeout_s)
        except WorkerLost as exc:
            raise _PrepareFailed(f"{exc.status}: {exc.detail}") from None
        if reply.get("status") != "ok":
            raise _PrepareFailed(str(reply.get("detail")))
        self.worker.prepared = pid

    def _retime(self, problem: Problem, space: Space, results: dict[Candidate, Result],
                eligible: set[Candidate]) -> dict[Candidate, Retimed] | None:
        pol = self.s.policy
        lead = leaders(results, pol.retime_top, space.default, eligible)
        if len(lead) < 2 or pol.retime_rounds < 1:
            return None
        self.emit(Event("retime", {"problem": problem, "leaders": len(lead),
                                   "device": self.worker.device}))
        msg = {"cmd": "retime", "op": problem.op, "key": problem.as_dict(),
               "candidates": [c.to_dict() for c in lead], "policy": pol.to_dict()}
        per_round = (pol.retime_budget_ms + min(pol.warmup_ms, 5.0)) / 1e3
        timeout = self.s.candidate_timeout_s + 4 * per_round * pol.retime_rounds * len(lead)
        try:
            self._prepare(problem)
            reply = self.worker.request(msg, timeout)
        except WorkerLost:
            return None  # the first-pass timings decide
        if reply.get("status") != "ok":
            return None
        out: dict[Candidate, Retimed] = {}
        for d in reply["leaders"]:
            cand = Candidate.of(d["variant"], d.get("params") or {})
            out[cand] = Retimed(cand, Timing(d["median_us"], d["p20_us"], d["p80_us"], d["n"]),
                                tuple(d.get("round_medians") or ()))
        self.journal.retime(problem, out)
        return out

    def _tally(self, out: ProblemOutcome, space: Space, results: dict[Candidate, Result]
               ) -> None:
        in_space = [r for c, r in results.items() if c in space.workspace]
        out.tried = len(in_space)
        out.failed = {r: sum(1 for x in in_space if x.status == r) for r in FAIL_REASONS}
        bad = [x for x in in_space if not x.ok]
        if bad and not out.detail:
            first = bad[0]
            out.detail = f"e.g. {first.candidate.label()}: {first.status} {first.detail}"[:300]

    def _finish(self, out: ProblemOutcome, t0: float) -> ProblemOutcome:
        out.elapsed_s = time.monotonic() - t0
        if out.status == "unplanned" and not self.stop():
            self.journal.done(out.problem, {"status": "unplanned", "detail": out.detail})
        self.emit(Event("problem_done", {"outcome": out, "device": self.worker.device}))
        return out


def _result(cand: Candidate, reply: dict[str, Any], elapsed: float) -> Result:
    status = reply.get("status", "crashed")
    detail = str(reply.get("detail") or "")
    if status not in ("ok", *FAIL_REASONS):  # a Python error in build/run
        status = "crashed"
    timing = None
    if status == "ok":
        timing = Timing(float(reply["median_us"]), float(reply["p20_us"]),
                        float(reply["p80_us"]), int(reply["n"]))
    return Result(cand, status, timing, reply.get("max_rel_err"),
                  int(reply.get("workspace_bytes") or 0), detail, elapsed)


def _seed(run_seed: int, pid: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(f"{run_seed}:{pid}".encode()).digest()[:4], "little")
