"""``dnnctl tune --ray``: tune a workload over the GPUs of a Ray cluster (extra ``dnnctl[ray]``).

One Ray task per problem, each needing one GPU (``num_gpus=1``): Ray places the tasks, runs
as many at once as the cluster has GPUs, and re-runs a task whose worker or node died
(``max_retries``); nothing here schedules. Inside a task the ordinary single-host tuner runs
the problem on the GPU Ray assigned (worker subprocess, timeouts, verification). Results
are gathered as they finish, each written to the run's journal at once, so an interrupted
fleet run continues with ``resume=True``; at the end entries are grouped by the hardware
fingerprint of the node that measured them, one plan section per fingerprint.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dnnctl.errors import BackendUnavailableError, UsageError
from dnnctl.ops import registry
from dnnctl.plan.digest import kernels_digest
from dnnctl.plan.io import update_plan
from dnnctl.plan.schema import Plan, PlanEntry, Section, utc_now
from dnnctl.plan.validate import entry_from_record
from dnnctl.tune.journal import Journal, problem_id
from dnnctl.tune.report import Event, ProblemOutcome, Progress, TuneInterrupted, TuneReport
from dnnctl.tune.tuner import TuneOptions
from dnnctl.workloads.model import WorkItem, Workload

FLEET = {"fleet": "ray"}  # the journal header's device: sections come from the results


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs the 'ray' package",
                         hint="pip install 'dnnctl[ray]' on this machine and every node"
                         ) from None
    return ray


def tune_problem(op: str, key: dict[str, Any], count: int, options: dict[str, Any],
                 plugins: str) -> dict[str, Any]:
    """The body of one Ray task: tune one problem on this node's GPU (the one Ray assigned
    through CUDA_VISIBLE_DEVICES) with the single-host tuner; return plain data."""
    from dnnctl.tune.tuner import tune

    if plugins:
        os.environ[registry.PLUGINS_ENV] = plugins
    wl = Workload(op)
    wl.add(op, key, count)
    with tempfile.TemporaryDirectory(prefix="dnnctl-ray-") as tmp:
        opts = TuneOptions(**{**options, "output": Path(tmp) / "plan.yaml",
                              "journal": Path(tmp) / "journal", "resume": False,
                              "keep_journal": False})
        report = tune(wl, opts)
    (outcome,) = report.outcomes
    return {"host": socket.gethostname(), "fingerprint": report.device,
            "backend": report.backend, "kernels_digest": kernels_digest(),
            "outcome": outcome.to_dict(),
            "entry": None if outcome.entry is None else outcome.entry.to_data()}


def tune_on_ray(workload: Workload, options: TuneOptions, address: str | None = None,
                progress: Progress | None = None, *, retries: int = 3) -> TuneReport:
    """Tune every problem of ``workload`` as Ray tasks; merge one plan section per device
    fingerprint into ``options.output``. ``address``: a Ray cluster (``auto``, ``ray://…``
    or host:port), or None for ``ray.init()``'s default (``$RAY_ADDRESS`` or a local one)."""
    ray = _ray()
    t0 = time.monotonic()
    if options.devices:
        raise UsageError("--devices and --ray do not go together",
                         hint="Ray gives each task one GPU of the cluster")
    work = workload.only_ops(options.ops)
    if not work.items:
        raise UsageError(f"nothing to tune: workload {workload.name!r} has no problems")
    if not ray.is_initialized():
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise BackendUnavailableError(f"cannot reach the Ray cluster {address!r}: {exc}",
                                          hint="start it with 'ray start --head' or give its "
                                               "address: --ray HOST:6379") from None
    if not ray.cluster_resources().get("GPU"):
        raise BackendUnavailableError("the Ray cluster has no GPU resources",
                                      hint="start nodes with GPUs (or --num-gpus N)")
    journal = Journal(options.journal or Path(str(options.output) + ".journal"))
    digest = kernels_digest()
    policy = options.policy.to_dict() if options.policy else "default"
    state = journal.start({"device": FLEET, "kernels_digest": digest, "policy": policy,
                           "deterministic": options.deterministic}, resume=options.resume)
    emit = progress or (lambda event: None)
    done: dict[str, tuple[ProblemOutcome, dict[str, Any] | None]] = {}
    todo: list[WorkItem] = []
    for it in work.items:
        rec = state.problems.get(problem_id(it.problem))
        if options.resume and rec is not None and (rec.done or {}).get("entry") is not None:
            done[problem_id(it.problem)] = _from_record(it, rec.done)
        else:
            todo.append(it)
    emit(Event("start", {"problems": len(work.items), "todo": len(todo), "device": {
        "name": f"Ray cluster ({int(ray.cluster_resources()['GPU'])} GPUs)",
        "backend": "ray"}, "devices": [], "workload": work.name}))
    task_opts = _task_options(options)
    remote = ray.remote(num_gpus=1, max_retries=retries)(tune_problem)
    pending = {remote.remote(it.problem.op, it.problem.as_dict(), it.count, task_opts,
                             os.environ.get(registry.PLUGINS_ENV, "")): it for it in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            it = pending.pop(ready[0])
            try:
                data = ray.get(ready[0])
            except ray.exceptions.RayError as exc:  # failed after Ray's retries
                data = {"outcome": {"status": "unplanned", "tried": 0, "failed": {},
                                    "detail": f"Ray task failed: {type(exc).__name__}: "
                                              + str(exc).splitlines()[0][:200]}}
            record = {"status": data["outcome"]["status"], **data}
            journal.done(it.problem, record)
            done[problem_id(it.problem)] = _from_record(it, record)
            emit(Event("problem_done", {"outcome": done[problem_id(it.problem)][0],
                                        "device": data.get("host")}))
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        journal.close()
        raise TuneInterrupted(
            f"fleet tuning interrupted; every finished problem is in {journal.path}",
            hint="run the same command with --resume to continue where it stopped") from None
    ordered = [done[problem_id(it.problem)] for it in work.items]
    notes = _write_sections(Path(options.output), ordered, options)
    journal.close()
    outcomes = [o for o, _ in ordered]
    complete = all(o.status != "unplanned" for o in outcomes)
    if complete and not options.keep_journal:
        journal.remove()
    else:
        notes.append(f"journal kept at {journal.path}")
    report = TuneReport(str(options.output), str(journal.path), "ray", [],
                        {"name": f"Ray fleet ({len(_fingerprints(ordered))} device kinds)",
                         "backend": "ray"}, work.name, options.strategy, outcomes,
                        time.monotonic() - t0, {"policy": policy}, notes)
    emit(Event("finish", {"report": report}))
    return report


def _task_options(options: TuneOptions) -> dict[str, Any]:
    """TuneOptions a task runs with: this run's settings, one device (Ray's GPU)."""
    opts = replace(options, devices=None, journal=None, ops=None, budget_s=None)
    device = opts.device
    if device and device.startswith("cuda"):
        device = "cuda:0"  # Ray exposes only the assigned GPU, as device 0
    return {"device": device, "candidate_timeout_s": opts.candidate_timeout_s,
            "prepare_timeout_s": opts.prepare_timeout_s, "strategy": opts.strategy,
            "max_evals": opts.max_evals, "deterministic": opts.deterministic,
            "seed": opts.seed, "policy": opts.policy, "build_helpers": opts.build_helpers}


def _from_record(it: WorkItem, rec: dict[str, Any]
                 ) -> tuple[ProblemOutcome, dict[str, Any] | None]:
    """A journal 'done' record of a fleet run -> the outcome and its device fingerprint."""
    o = rec.get("outcome", {})
    entry: PlanEntry | None = None
    if rec.get("entry") is not None:
        entry = entry_from_record(rec["entry"], rec.get("backend", "cupy"), "<ray journal>")
    status = "planned" if entry is not None else "unplanned"
    where = None
    if entry is not None:  # the node's device and kernels: its plan section
        where = {**rec.get("fingerprint", {}), "_digest": rec.get("kernels_digest")}
    return (ProblemOutcome(it.problem, it.count, status, entry, tried=int(o.get("tried", 0)),
                           failed={k: v for k, v in (o.get("failed") or {}).items() if v},
                           space=int(o.get("space", 0)), detail=str(o.get("detail", "")),
                           elapsed_s=float(o.get("elapsed_s", 0.0))), where)


def _fingerprints(ordered: list[tuple[ProblemOutcome, dict[str, Any] | None]]
                  ) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for _, fp in ordered:
        if fp is not None and fp not in seen:
            seen.append(fp)
    return seen


def _write_sections(output: Path, ordered: list[tuple[ProblemOutcome, dict[str, Any] | None]],
                    options: TuneOptions) -> list[str]:
    """Merge the entries into ``output``: one section per device fingerprint and kernels
    digest (a node running other dnnctl kernels gets its own section); pins are kept."""
    groups = _fingerprints(ordered)
    if not groups:
        return ["no problem was planned; no plan written"]
    tuning = {"strategy": options.strategy, "deterministic": options.deterministic,
              "fleet": "ray"}
    notes = []

    def change(plan: Plan) -> None:
        for where in groups:
            fp = {k: v for k, v in where.items() if k != "_digest"}
            digest = where.get("_digest") or kernels_digest()
            section = plan.section_for(fp, digest)
            if section is None:
                section = Section(fp, digest)
                plan.sections.append(section)
            section.created, section.tuning = utc_now(), dict(tuning)
            n = 0
            for o, efp in ordered:
                if efp == where and o.entry is not None:
                    cur = section.find(o.problem)
                    if cur is None or not cur.pinned:
                        section.upsert(o.entry)
                        n += 1
            notes.append(f"section {section.label()}: {n} entries")

    update_plan(output, change)
    return notes
