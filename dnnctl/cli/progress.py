"""Progress of ``dnnctl tune`` on stderr: a live bar on a terminal, one line per finished
problem elsewhere, or (``--json``) one JSON object per line.

The ETA comes from the measured wall time per candidate so far, times the candidates left:
those of the problems being measured, plus, for problems not started yet, the mean number
of candidates per problem seen so far.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from dnnctl.cli.render import err_console


def short_key(problem: Any) -> str:
    """The key fields that differ from their defaults, compactly."""
    from dnnctl.ops import registry

    fields = registry.get_op(problem.op).fields
    parts = []
    for name, value in problem.key:
        spec = fields.get(name)
        if spec is not None and not spec.required and spec.default == value:
            continue
        text = "x".join(map(str, value)) if isinstance(value, tuple) else str(value)
        parts.append(text if name in ("dtype", "layout") else f"{name}={text}")
    return " ".join(parts)


def short_problem(problem: Any) -> str:
    return f"{problem.op} {short_key(problem)}"


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA --"
    s = int(round(seconds))
    return f"ETA {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"ETA {s // 60}:{s % 60:02d}"


class Eta:
    """Candidates done and left, and the measured seconds per candidate."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.problems = self.finished = 0
        self.done = 0  # candidates measured
        self.current: dict[Any, tuple[int, int]] = {}  # device -> (done, total)
        self.finished_candidates = 0

    def seconds_left(self, slots: int = 1) -> float | None:
        if self.done == 0:
            return None
        per = (time.monotonic() - self.t0) / self.done
        in_flight = sum(max(0, t - d) for d, t in self.current.values())
        started = self.finished + len(self.current)
        mean = (self.finished_candidates + sum(t for _, t in self.current.values())) / max(
            started, 1)
        future = max(0, self.problems - started) * mean
        return (in_flight + future) * per / max(1, slots)


class View:
    """Human progress: a live display on a terminal, else one line per finished problem
    (logs stay readable)."""

    def __init__(self) -> None:
        self.live = err_console.is_terminal
        self.progress: Progress | None = None
        self.overall: TaskID | None = None
        self.tasks: dict[Any, TaskID] = {}
        self.eta = Eta()
        self.slots = 1

    def __call__(self, event: Any) -> None:
        track(self.eta, event)
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event.data)

    def _on_start(self, d: dict[str, Any]) -> None:
        dev = d["device"]
        self.slots = max(1, len(d["devices"]))
        err_console.print(f"[bold]dnnctl tune[/] {escape(d['workload'])}: {d['problems']} "
                          f"problems on {escape(str(dev.get('name')))} ({dev.get('backend')}"
                          + (f", devices {d['devices']}" if len(d["devices"]) > 1 else "")
                          + ")")
        if self.live:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(bar_width=20),
                MofNCompleteColumn(), TextColumn("{task.fields[eta]}"),
                console=err_console, transient=True)
            self.progress.start()
            self.overall = self.progress.add_task("[bold]problems", total=d["problems"],
                                                  eta=fmt_eta(None))

    def _on_problem(self, d: dict[str, Any]) -> None:
        if self.progress is None:
            return
        label = escape(short_problem(d["problem"]))[:44]
        tid = self.tasks.get(d["device"])
        if tid is None:
            tid = self.progress.add_task(label, total=max(1, d["candidates"]), eta="")
            self.tasks[d["device"]] = tid
        else:
            self.progress.reset(tid, total=max(1, d["candidates"]), description=label)

    def _on_candidate(self, d: dict[str, Any]) -> None:
        tid = self.tasks.get(d["device"])
        if self.progress is not None and tid is not None:
            self.progress.update(tid, completed=d["done"], total=max(1, d["total"]))
        self._update_eta()

    def _on_retime(self, d: dict[str, Any]) -> None:
        tid = self.tasks.get(d["device"])
        if self.progress is not None and tid is not None:
            self.progress.update(tid, description=escape(
                f"{short_problem(d['problem'])[:30]} (re-timing)"))

    def _on_problem_done(self, d: dict[str, Any]) -> None:
        o = d["outcome"]
        if self.progress is not None and self.overall is not None:
            self.progress.advance(self.overall)
            self._update_eta()
            return
        line = f"[{self.eta.finished}/{self.eta.problems}] {short_problem(o.problem)}: "
        if o.entry is not None:
            sp = o.entry.speedup_vs_default()
            line += f"{o.entry.choice.label()} ({o.status}" + (
                f", {_us(o.entry.stats.median_us)}" if o.entry.stats else "") + (
                f", {sp:.2f}x vs default" if sp else "") + ")"
        else:
            line += f"unplanned: {o.detail}"
        if self.eta.finished < self.eta.problems:
            line += f"; {fmt_eta(self.eta.seconds_left(self.slots))}"
        err_console.print(escape(line))

    def _update_eta(self) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.update(self.overall, eta=fmt_eta(self.eta.seconds_left(self.slots)))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def track(eta: Eta, event: Any) -> None:
    """Update the ETA model from one tuner event."""
    d = event.data
    if event.kind == "start":
        eta.problems = int(d["problems"])
    elif event.kind == "problem":
        if not eta.done and not eta.current:  # the clock starts with the first problem,
            eta.t0 = time.monotonic()  # not with worker start-up
        eta.current[d["device"]] = (0, int(d["candidates"]))
    elif event.kind == "candidate":
        eta.done += 1
        eta.current[d["device"]] = (int(d["done"]), int(d["total"]))
    elif event.kind == "problem_done":
        eta.finished += 1
        done, _ = eta.current.pop(d.get("device"), (0, 0))
        eta.finished_candidates += done


class JsonLines:
    """``--json`` progress: one JSON object per event, one per line, on stderr."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self.eta = Eta()
        self.slots = 1

    def __call__(self, event: Any) -> None:
        track(self.eta, event)
        d = event.data
        out: dict[str, Any] = {"event": event.kind}
        if event.kind == "start":
            self.slots = max(1, len(d["devices"]))
            out.update(workload=d["workload"], problems=d["problems"], todo=d["todo"],
                       device=d["device"], devices=d["devices"])
        elif event.kind in ("problem", "candidate", "retime"):
            out.update(op=d["problem"].op, key=d["problem"].as_dict(), device=d["device"])
            if event.kind == "problem":
                out["candidates"] = d["candidates"]
            elif event.kind == "candidate":
                out.update(done=d["done"], total=d["total"], result=d["result"].to_dict())
            else:
                out["leaders"] = d["leaders"]
        elif event.kind == "problem_done":
            out.update(d["outcome"].to_dict(), device=d.get("device"),
                       finished=self.eta.finished, problems=self.eta.problems)
        elif event.kind == "finish":
            out["elapsed_s"] = round(d["report"].elapsed_s, 3)
        if event.kind in ("candidate", "problem_done"):
            left = self.eta.seconds_left(self.slots)
            out["eta_s"] = None if left is None else round(left, 1)
        stream = self.stream or sys.stderr
        stream.write(json.dumps(out, default=str) + "\n")
        stream.flush()


def _us(v: float) -> str:
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"
