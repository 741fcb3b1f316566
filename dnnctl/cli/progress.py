"""Progress of ``dnnctl tune`` on stderr: a live bar on a terminal, one line per finished
problem elsewhere, or (``--json``) one JSON object per line; the time left comes from
:mod:`dnnctl.tune.eta`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from dnnctl.cli.render import err_console, fmt_eta, fmt_us, short_problem
from dnnctl.tune.eta import Eta, track


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
                f", {fmt_us(o.entry.stats.median_us)}" if o.entry.stats else "") + (
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

