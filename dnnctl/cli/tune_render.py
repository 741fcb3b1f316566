"""Rendering of a ``dnnctl tune`` report: the per-problem table (80 columns) and a summary.

Per problem: the winner, its time, speed-up over the default heuristic and over the
runner-up, candidates tried / failed by reason.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.render import console, fmt_us, short_problem


def render(report: Any) -> None:
    """The per-problem table and a summary line."""
    table = Table(title=f"dnnctl tune — {escape(report.workload)} on "
                        f"{escape(str(report.device.get('name')))}", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    # 80 columns: problem and winner wrap at spaces, numbers never; failures under the winner
    table.add_column("problem", ratio=1, overflow="fold")
    table.add_column("winner", ratio=1, overflow="fold")
    for col in ("time", "×default", "×2nd", "tried"):
        table.add_column(col, justify="right", no_wrap=True)
    for o in report.outcomes:
        e = o.entry
        failed = ", ".join(f"{n} {r}" for r, n in (o.failed or {}).items() if n)
        problem = escape(short_problem(o.problem))
        if e is None:
            table.add_row(problem, f"[red]unplanned[/] {escape(o.detail)[:80]}"
                          + (f"\n[dim]failed: {failed}[/]" if failed else ""), "—", "—", "—",
                          str(o.tried))
            continue
        winner = escape(e.choice.label().replace(",", ", ")) + (
            "" if o.status == "planned" else f" [dim]({o.status})[/]")
        if e.partial:
            winner += f" [yellow](partial: {e.compared} of {o.space} compared)[/]"
        if failed:
            winner += f"\n[dim]failed: {failed}[/]"
        sd, sr = e.speedup_vs_default(), e.speedup_vs_runner_up()
        table.add_row(problem, winner, fmt_us(e.stats.median_us if e.stats else None),
                      f"{sd:.2f}" if sd else "—", f"{sr:.2f}" if sr else "—",
                      str(o.tried or e.tried))
    console.print(table)
    n_unplanned = len(report.unplanned)
    summary = (f"{len(report.outcomes) - n_unplanned}/{len(report.outcomes)} problems planned"
               + (f" ({len(report.partial)} partial: cut short by --budget)"
                  if report.partial else "")
               + f" in {report.elapsed_s:.1f} s; plan: {escape(report.plan_path)}")
    console.print(("[bold red]" if n_unplanned else "[bold green]") + summary + "[/]")
    for note in report.notes:
        console.print(f"[dim]{escape(note)}[/]")
    if n_unplanned:
        console.print("[yellow]unplanned problems run the default heuristic; see the "
                      "failures above (--json for details)[/]")

