"""The tuning journal: one JSON line per event, flushed and fsync'ed as it lands.

An interrupted run (Ctrl-C, kill -9, a power cut) loses at most the line being written;
``dnnctl tune --resume`` reads the journal back (a torn last line is ignored), skips every
candidate already measured and every problem already decided, and carries on.

Lines: a ``header`` (device fingerprint, kernels digest, timing policy), then per problem
``result`` (one candidate), ``retime`` (the leaders' interleaved re-timing) and ``done``
(the decided plan entry, or ``unplanned``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnctl.errors import InputFileError, UsageError
from dnnctl.files.locking import LockedError, describe_holder, holder, path_lock
from dnnctl.ops.base import Problem
from dnnctl.plan.schema import Timing
from dnnctl.tune.candidates import Candidate
from dnnctl.tune.results import Result
from dnnctl.tune.select import Retimed

SCHEMA = "dnnctl-journal/1"


def problem_id(problem: Problem) -> str:
    """A stable text id of a problem (op + canonical key JSON)."""
    return problem.op + json.dumps(problem.as_dict(), sort_keys=True, separators=(",", ":"))


def journal_path(output: str | os.PathLike[str], workload: str, problems: list[Problem],
                 fingerprint: dict[str, Any]) -> Path:
    """The journal of one (output plan, workload, device fingerprint):
    ``<output>.<workload>-<hash>.journal``, the hash over the problems and the fingerprint,
    so two tunes writing one plan never share (or wipe) each other's journal."""
    ident = json.dumps({"problems": sorted(problem_id(p) for p in problems),
                        "device": fingerprint}, sort_keys=True, default=str)
    digest = hashlib.sha256(ident.encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", workload).strip("-.")[:40] or "workload"
    return Path(f"{os.fspath(output)}.{slug}-{digest}.journal")


@dataclass
class ProblemLog:
    """What the journal knows about one problem."""

    results: dict[Candidate, Result] = field(default_factory=dict)
    retimed: dict[Candidate, Retimed] | None = None
    done: dict[str, Any] | None = None  # the 'done' record


@dataclass
class JournalState:
    header: dict[str, Any] | None
    problems: dict[str, ProblemLog]
    torn_lines: int = 0


class Journal:
    """Append-only, durable event log of one tuning run."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fh: Any = None
        self._lock = threading.Lock()
        self._held = contextlib.ExitStack()  # the journal's file lock, from start to close

    def _acquire(self) -> None:
        """Hold the journal's lock until :meth:`close`; a second tune on it is refused."""
        try:
            self._held.enter_context(path_lock(self.path, timeout=0, purpose="tune journal"))
        except LockedError:
            raise LockedError(
                f"another tune is already using the journal {self.path}: "
                f"{describe_holder(holder(self.path))}",
                hint="wait for it to finish, or tune into another plan (-o)"
            ) from None

    def start(self, header: dict[str, Any], *, resume: bool) -> JournalState:
        """Open for appending. With ``resume`` and a matching header, return what is known;
        otherwise start an empty journal."""
        self._acquire()
        try:
            return self._open(header, resume)
        except BaseException:
            self.close()
            raise

    def _open(self, header: dict[str, Any], resume: bool) -> JournalState:
        state = JournalState(None, {})
        if resume and self.path.exists():
            state = read_journal(self.path)
            if state.header is not None:
                mismatch = header_mismatch(state.header, header)
                if mismatch:
                    raise UsageError(
                        f"cannot resume from {self.path}: it was written {mismatch}",
                        hint="run without --resume to start over (the old journal is replaced)")
        fresh = state.header is None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "w" if fresh else "a", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise InputFileError(str(self.path), f"cannot be written: {exc.strerror or exc}",
                                 "tune into a writable directory (-o), where the plan and "
                                 "its journal go") from None
        if fresh:
            state = JournalState(None, {})
            self._append({"type": "header", "schema": SCHEMA, **header})
        elif state.torn_lines:
            self._fh.write("\n")  # terminate a torn last line so new records parse
        return state

    def result(self, problem: Problem, result: Result, device: int) -> None:
        self._append({"type": "result", "problem": problem_id(problem), "device": device,
                      **result.to_dict()})

    def retime(self, problem: Problem, retimed: dict[Candidate, Retimed]) -> None:
        self._append({"type": "retime", "problem": problem_id(problem), "leaders": [
            {**rt.candidate.to_dict(), "median_us": rt.timing.median_us,
             "p20_us": rt.timing.p20_us, "p80_us": rt.timing.p80_us, "n": rt.timing.n,
             "round_medians": list(rt.round_medians)} for rt in retimed.values()]})

    def done(self, problem: Problem, record: dict[str, Any]) -> None:
        self._append({"type": "done", "problem": problem_id(problem), **record})

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=False, separators=(",", ":"), default=str)
        with self._lock:
            if self._fh is None:
                raise RuntimeError("journal is not open")
            self._fh.write(line + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file and release the journal's lock."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._held.close()

    def remove(self) -> None:
        """Delete the journal (while still holding its lock), then close."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.close()


def read_journal(path: str | os.PathLike[str]) -> JournalState:
    """Parse a journal; unparseable lines (a torn last write) are counted and skipped."""
    header: dict[str, Any] | None = None
    problems: dict[str, ProblemLog] = {}
    torn = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
                kind = rec.get("type")
                if kind == "header":
                    if rec.get("schema") != SCHEMA:
                        raise ValueError("schema")
                    header = rec
                    continue
                if kind not in ("result", "retime", "done"):
                    continue  # a record type this version does not use
                log = problems.setdefault(str(rec["problem"]), ProblemLog())
                if kind == "result":
                    res = Result.from_dict(rec)
                    log.results[res.candidate] = res
                elif kind == "retime":
                    log.retimed = {}
                    for d in rec["leaders"]:
                        cand = Candidate.of(d["variant"], d.get("params") or {})
                        log.retimed[cand] = Retimed(cand, Timing(
                            float(d["median_us"]), float(d["p20_us"]), float(d["p80_us"]),
                            int(d["n"])), tuple(float(x) for x in d.get("round_medians", ())))
                elif kind == "done":
                    log.done = rec
            except (ValueError, KeyError, TypeError, AttributeError):
                torn += 1
    return JournalState(header, problems, torn)


def header_mismatch(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why a journal cannot be resumed by this run, or None."""
    if old.get("device") != new.get("device"):
        return f"on another device ({old.get('device')})"
    if old.get("kernels_digest") != new.get("kernels_digest"):
        return "with other kernels (kernels digest differs)"
    if old.get("policy") != new.get("policy"):
        return "with other timing settings"
    if old.get("deterministic") != new.get("deterministic"):
        return "with a different --deterministic setting"
    return None
