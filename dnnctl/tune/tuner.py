"""``dnnctl tune``: tune a workload on one or more identical devices and write the plan.

Every problem runs in worker subprocesses (one per device); results land in a journal as
they come, so ``resume=True`` continues an interrupted run; at the end the decided entries
are merged into the output plan (under its file lock): the section of this device
fingerprint + kernels digest is updated, pinned entries are kept, other devices' sections
are left alone, and a section of this device made with other kernels is replaced (its
pinned entries carried over).
"""

from __future__ import annotations

import collections
import importlib
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import parse_device, require_backend
from dnnctl.errors import UsageError
from dnnctl.ops import costmodel as cm
from dnnctl.ops import registry
from dnnctl.plan.digest import kernels_digest
from dnnctl.plan.io import read_plan, update_plan
from dnnctl.plan.schema import Plan, PlanEntry, Section, same_device, utc_now
from dnnctl.plan.validate import entry_from_record
from dnnctl.tune.build_ahead import BuildAhead, default_helpers
from dnnctl.tune.journal import Journal, JournalState, ProblemLog, journal_path, problem_id
from dnnctl.tune.pool import Worker, check_identical
from dnnctl.tune.problem import ProblemTuner, Settings
from dnnctl.tune.report import Event, ProblemOutcome, Progress, TuneInterrupted, TuneReport
from dnnctl.tune.strategies import get_strategy
from dnnctl.tune.timer import TimingPolicy
from dnnctl.workloads.model import WorkItem, Workload


@dataclass
class TuneOptions:
    """Everything ``dnnctl tune`` can be asked (the CLI fills it from its flags)."""

    device: str | None = None  # 'cuda:N', 'cpu' or None (the best device here)
    devices: tuple[int, ...] | None = None  # several identical GPUs, in parallel
    output: str | Path = "plan.yaml"
    journal: str | Path | None = None  # default: <output>.<workload>-<hash>.journal
    budget_s: float | None = None  # whole run, a hard wall (see _Runner)
    candidate_timeout_s: float = 120.0  # build + verify + time of one candidate
    prepare_timeout_s: float = 900.0  # inputs + float64 reference of one problem
    strategy: str = "auto"  # exhaustive for small spaces, local search for large ones
    max_evals: int | None = None  # per problem
    resume: bool = False
    deterministic: bool = False
    ops: tuple[str, ...] | None = None
    seed: int = 0
    policy: TimingPolicy | None = None  # default: TimingPolicy.for_backend(...)
    keep_journal: bool = False  # keep the journal after a complete run
    build_helpers: int | None = None  # compile processes per device (default: GPU only)
    _slots: tuple[int, ...] | None = field(default=None, repr=False)  # tests: worker slots


HELPER_START_S = 60.0  # at most this long for the build helpers to start


def tune(workload: Workload, options: TuneOptions | None = None,
         progress: Progress | None = None) -> TuneReport:
    """Tune every problem of ``workload``; write/merge the plan; return the report."""
    opts = options or TuneOptions()
    t0 = time.monotonic()
    backend_name, index = parse_device(opts.device)
    slots = list(opts._slots or opts.devices or (index,))
    _check_devices(backend_name, slots, explicit=opts._slots is None)
    for mod in registry.plugin_modules():
        importlib.import_module(mod)
    policy = opts.policy or TimingPolicy.for_backend(backend_name)
    if policy.host_ahead and backend_name == "numpy":
        raise UsageError("--gpu-time times a GPU's work alone; on the CPU the host is the "
                         "device, so there is nothing to enqueue ahead",
                         hint="leave --gpu-time out, or tune on a GPU (--device cuda:0)")
    get_strategy(opts.strategy, opts.seed, opts.max_evals)  # validate early
    work = workload.only_ops(opts.ops)
    if not work.items:
        raise UsageError(f"nothing to tune: workload {workload.name!r} has no problems"
                         + (f" of ops {', '.join(opts.ops)}" if opts.ops else ""),
                         hint="check --ops, or the workload name / file")
    output = Path(opts.output)
    existing = read_plan(output) if output.exists() else None  # a bad plan stops us early
    emit = _emitter(progress)
    workers = [Worker(backend_name, s) for s in slots]
    aheads: list[BuildAhead | None] = []
    journal: Journal | None = None
    try:
        helpers = opts.build_helpers if opts.build_helpers is not None else default_helpers(
            backend_name, len(slots))
        # the helpers start alongside the slot workers, and are waited for (bounded) so that
        # compiling ahead begins with the first problem rather than part way through
        aheads = [BuildAhead(backend_name, s, helpers, opts.candidate_timeout_s)
                  if helpers > 0 else None for s in slots]
        hellos = _start_all(workers)
        for a in aheads:
            if a is not None:
                a.wait_ready(HELPER_START_S)
        check_identical(hellos)
        fp = hellos[0]["fingerprint"]
        info = DeviceInfo(**hellos[0]["device"])
        digest = kernels_digest()
        journal = Journal(opts.journal or journal_path(
            output, work.name, [it.problem for it in work.items], fp))
        state = journal.start({"device": fp, "kernels_digest": digest,
                               "policy": policy.to_dict(), "deterministic": opts.deterministic},
                              resume=opts.resume)
        settings = Settings(backend_name, info, policy, opts.strategy, opts.max_evals,
                            opts.seed, opts.deterministic, opts.candidate_timeout_s,
                            opts.prepare_timeout_s)
        outcomes, queue = _precomputed(work, existing, fp, digest, state, opts.resume,
                                       backend_name)
        emit(Event("start", {"problems": len(work.items), "todo": len(queue),
                             "device": fp, "devices": slots, "workload": work.name}))
        for o in outcomes.values():
            emit(Event("problem_done", {"outcome": o, "device": None}))
        runner = _Runner(settings, workers, aheads, journal, queue, emit, opts.budget_s, t0)
        outcomes.update(runner.run())
    except KeyboardInterrupt:
        for w in workers:
            w.kill()
        where = journal.path if journal is not None else "the journal"
        if journal is not None:
            journal.close()
        raise TuneInterrupted(
            f"tuning interrupted; every measured candidate is in {where}",
            hint="run the same command with --resume to continue where it stopped") from None
    except BaseException:
        if journal is not None:
            journal.close()
        raise
    finally:
        for a in aheads:
            if a is not None:
                a.close()
        for w in workers:
            w.close()
    try:
        ordered = [outcomes[problem_id(it.problem)] for it in work.items]
        notes = _write_plan(output, ordered, fp, digest, policy, opts)
        complete = all(o.status != "unplanned" and not o.partial for o in ordered)
    except BaseException:
        journal.close()
        raise
    if complete and not opts.keep_journal:
        journal.remove()
    else:
        journal.close()
        notes.append(f"journal kept at {journal.path}")
    report = TuneReport(str(output), str(journal.path), backend_name, slots, fp, work.name,
                        opts.strategy, ordered, time.monotonic() - t0, policy.to_dict(), notes,
                        prebuilt=sum(a.built for a in aheads if a is not None))
    emit(Event("finish", {"report": report}))
    return report


# ----------------------------------------------------------------------------- setup


def _check_devices(backend_name: str, slots: list[int], *, explicit: bool) -> None:
    backend = require_backend(backend_name)
    count = backend.device_count()
    for s in slots:
        if not 0 <= s < count:
            raise UsageError(f"device {s} does not exist ({count} {backend_name} device(s))",
                             hint="see 'nvidia-smi -L' / dnnctl doctor")
    if explicit and len(set(slots)) != len(slots):
        raise UsageError(f"--devices lists a device twice: {slots}")
    if explicit and backend_name == "numpy" and len(slots) > 1:
        raise UsageError("--devices applies to GPUs; the CPU backend has one device")


def _start_all(workers: list[Worker]) -> list[dict[str, Any]]:
    """Start every worker; they import and initialize in parallel. Raise the first failure."""
    hellos: list[Any] = [None] * len(workers)
    errors: list[BaseException] = []

    for w in workers:  # spawned by this (long-lived) thread: see Worker.spawn
        w.spawn()

    def go(i: int) -> None:
        try:
            hellos[i] = workers[i].handshake()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    if errors:
        raise errors[0]
    return hellos


def _precomputed(work: Workload, existing: Plan | None, fp: dict[str, Any], digest: str,
                 state: JournalState, resume: bool, backend: str
                 ) -> tuple[dict[str, ProblemOutcome], list[tuple[WorkItem, ProblemLog]]]:
    """Outcomes known without measuring (pinned entries; with --resume, entries already in
    the plan or decided in the journal) and the queue of problems left to tune."""
    pinned: dict[Any, PlanEntry] = {}
    current: Section | None = None
    if existing is not None:
        for sec in existing.sections:
            if same_device(sec.device, fp):
                for e in sec.entries:
                    if e.pinned:
                        pinned.setdefault(e.problem, e)
        current = existing.section_for(fp, digest)
    done: dict[str, ProblemOutcome] = {}
    queue: list[tuple[WorkItem, ProblemLog]] = []
    for it in work.items:
        pid = problem_id(it.problem)
        if it.problem in pinned:
            done[pid] = ProblemOutcome(it.problem, it.count, "pinned", pinned[it.problem],
                                       detail="pinned in the plan")
            continue
        log = state.problems.get(pid, ProblemLog())
        if resume and current is not None and current.find(it.problem) is not None and \
                not current.find(it.problem).partial:
            done[pid] = ProblemOutcome(it.problem, it.count, "kept", current.find(it.problem),
                                       detail="already in the plan (--resume)")
            continue
        if resume and log.done is not None and log.done.get("status") == "planned" and \
                not log.done["entry"].get("partial"):
            entry = entry_from_record(log.done["entry"], backend, "<journal>")
            done[pid] = ProblemOutcome(it.problem, it.count, "planned", entry,
                                       tried=entry.tried, failed=dict(entry.failed),
                                       detail="decided before the interruption (journal)")
            continue
        queue.append((it, log))
    return done, queue


def _emitter(progress: Progress | None) -> Any:
    lock = threading.Lock()

    def emit(event: Event) -> None:
        if progress is not None:
            with lock:
                progress(event)
    return emit


# ----------------------------------------------------------------------------- running


def floor_us(problem: Any) -> float:
    """A device-neutral lower bound of one call, from the op's roofline counts: its FLOPs at
    cuBLAS fp16 speed or its minimum bytes at copy bandwidth, plus the fixed cost of a
    call (the cost model's H200 constants). What orders and weighs a budgeted run's
    problems; only the proportions between problems matter."""
    try:
        op = registry.get_op(problem.op)
        flops, nbytes = float(op.flops(problem)), float(op.min_bytes(problem))
    except Exception:  # an op without roofline counts: one fixed call
        return cm.FIXED_US
    return cm.FIXED_US + max(flops / (cm.THROUGHPUT["cublas_fp16"] * 1e12),
                             nbytes / cm.HBM_BYTES_PER_S) * 1e6


def problem_weight(item: WorkItem) -> float:
    """The share of a model step a problem stands for: calls per step x floor_us."""
    return max(1, item.count) * floor_us(item.problem)


class _Runner:
    """Hands problems to one thread per worker from a shared queue. Under a budget the
    heaviest problems (:func:`problem_weight`) go first, so a cut run has planned them, and
    each problem's time is half an equal share of what is left and half a share by weight:
    the heavy convolutions of a model get longer searches than its small element-wise ops,
    and none starts with nothing."""

    def __init__(self, settings: Settings, workers: list[Worker],
                 aheads: list[BuildAhead | None], journal: Journal,
                 queue: list[tuple[WorkItem, ProblemLog]], emit: Any, budget_s: float | None,
                 t0: float):
        self.settings = settings
        self.workers = workers
        self.aheads = aheads
        self.journal = journal
        self.weights = {problem_id(it.problem): problem_weight(it) for it, _ in queue}
        if budget_s is not None:
            queue = sorted(queue, key=lambda q: -self.weights[problem_id(q[0].problem)])
        self.queue = collections.deque(queue)
        self.weight_left = sum(self.weights.values())
        self.emit = emit
        self.deadline = None if budget_s is None else t0 + budget_s
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.outcomes: dict[str, ProblemOutcome] = {}
        self.errors: list[BaseException] = []

    def run(self) -> dict[str, ProblemOutcome]:
        if len(self.workers) == 1:
            self._loop(0)
        else:
            threads = [threading.Thread(target=self._guarded, args=(i,), daemon=True)
                       for i in range(len(self.workers))]
            for t in threads:
                t.start()
            try:
                for t in threads:
                    while t.is_alive():
                        t.join(0.2)
            except KeyboardInterrupt:
                self.stopping.set()
                raise
            if self.errors:
                raise self.errors[0]
        return self.outcomes

    def _guarded(self, slot: int) -> None:
        try:
            self._loop(slot)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.errors.append(exc)
            self.stopping.set()

    def _loop(self, slot: int) -> None:
        tuner = ProblemTuner(self.settings, self.workers[slot], slot, self.journal, self.emit,
                             self.stopping.is_set, self.aheads[slot])
        while not self.stopping.is_set():
            with self.lock:
                if not self.queue:
                    return
                item, log = self.queue.popleft()
                left = len(self.queue) + 1
                weight = self.weights.get(problem_id(item.problem), 0.0)
                fraction = 0.5 / left + 0.5 * weight / max(self.weight_left, 1e-9)
                self.weight_left = max(0.0, self.weight_left - weight)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                outcome = ProblemOutcome(item.problem, item.count, "unplanned",
                                         detail="not started: the --budget ran out",
                                         slot=slot)
                self.emit(Event("problem_done", {"outcome": outcome, "device": None}))
            else:
                outcome = tuner.run(item.problem, item.count, log,
                                    self._problem_deadline(fraction),
                                    self.deadline if self.deadline is not None else math.inf)
            with self.lock:
                self.outcomes[problem_id(item.problem)] = outcome

    def _problem_deadline(self, fraction: float) -> float:
        """This problem's ``fraction`` of the remaining budget (all workers run in
        parallel)."""
        now = time.monotonic()
        if self.deadline is None:
            return float("inf")
        share = max(0.0, self.deadline - now) * len(self.workers) * min(1.0, fraction)
        return now + share


# ----------------------------------------------------------------------------- plan


def _write_plan(output: Path, outcomes: list[ProblemOutcome], fp: dict[str, Any], digest: str,
                policy: TimingPolicy, opts: TuneOptions) -> list[str]:
    notes: list[str] = []
    entries = [o.entry for o in outcomes if o.entry is not None and o.status != "pinned"]
    pinned = [o.entry for o in outcomes if o.entry is not None and o.status == "pinned"]
    tuning = {**policy.plan_metadata(), "strategy": opts.strategy,
              "deterministic": opts.deterministic}
    if opts.budget_s is not None:
        tuning["budget_s"] = opts.budget_s

    def change(plan: Plan) -> None:
        section = plan.section_for(fp, digest)
        old = [s for s in plan.sections if same_device(s.device, fp) and s is not section]
        fresh = section is None
        if section is None:
            section = Section(dict(fp), digest)
            plan.sections.append(section)
        for s in old:  # same device, other kernels: replaced, pins carried over
            for e in s.entries:
                if e.pinned and section.find(e.problem) is None:
                    section.upsert(e)
            plan.sections.remove(s)
            notes.append(f"replaced a section of this device made with other kernels "
                         f"({s.kernels_digest[:19]}...)")
        changed = fresh or bool(old)
        for e in pinned:
            if section.find(e.problem) is None:
                section.upsert(e)
                changed = True
        kept = 0
        for e in entries:
            cur = section.find(e.problem)
            if cur is not None and (cur.pinned or (e.partial and not cur.partial)):
                kept += not cur.pinned  # a budget cut short: the complete entry stays
                continue
            section.upsert(e)
            changed = True
        if kept:
            notes.append(f"kept {kept} complete entr{'y' if kept == 1 else 'ies'} over "
                         "this run's partial (budget-cut) results")
        if changed:  # the section's date and settings are those of its last measurements
            section.created = utc_now()
            section.tuning = tuning

    if not entries and not pinned and not output.exists():
        notes.append("no problem was planned; no plan written")
        return notes
    update_plan(output, change)
    return notes

