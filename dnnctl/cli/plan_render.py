"""Rendering of the ``dnnctl plan`` commands' results (tables that fit 80 columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.render import console, fmt_us, fmt_x, key_text


def render_show(info: dict[str, Any], plan: Path) -> None:
    """Every section as a table: problem, choice, time, speed-ups, pin."""
    if not info["sections"]:
        console.print(f"{escape(str(plan))}: no sections")
    for s in info["sections"]:
        state = ("[green]this machine[/]" if s["this_machine"] else
                 "[yellow]this machine, other kernels (stale)[/]" if s["stale_kernels"]
                 else "[dim]another device[/]")
        table = Table(title=f"section {s['index']}: {escape(s['label'])} — {state}",
                      caption=f"created {escape(s['created'])}, {len(s['entries'])} entries, "
                              f"{escape(s['kernels_digest'][:19])}…",
                      box=box.SIMPLE_HEAD, pad_edge=False)
        # 80 columns: problem and choice wrap at spaces; numbers never wrap
        table.add_column("problem", ratio=3, overflow="fold")
        table.add_column("choice", ratio=2, overflow="fold")
        for col in ("time", "×dflt", "×2nd", "pin"):
            table.add_column(col, justify="right", no_wrap=True)
        for e in s["entries"]:
            table.add_row(escape(f"{e['op']} {key_text(e['op'], e['key'])}"),
                          escape(e["choice"].replace(",", ", ")), fmt_us(e["median_us"]),
                          fmt_x(e["speedup_vs_default"]), fmt_x(e["speedup_vs_runner_up"]),
                          "yes" if e["pinned"] else "")
        console.print(table)


def render_coverage(res: dict[str, Any], plan: Path) -> None:
    """Hit / fallback / miss per problem of a workload, then the totals."""
    table = Table(title=f"coverage of {escape(res['workload'])} by {escape(str(plan))} "
                        f"(section {res['section']}: {escape(res['device'])})",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("problem", ratio=3, overflow="fold")
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("choice", ratio=2, overflow="fold")
    marks = {"hit": "[green]hit[/]", "fallback": "[yellow]fallback[/]",
             "miss": "[red]miss[/]"}
    for r in res["problems"]:
        table.add_row(escape(f"{r['op']} {key_text(r['op'], r['key'])}"),
                      str(r["count"]), marks[r["outcome"]],
                      escape((r["choice"] or "default heuristic").replace(",", ", ")))
    console.print(table)
    t, c = res["totals"], res["calls"]
    console.print(f"problems: {t['hit']} hit, {t['fallback']} fallback, {t['miss']} miss; "
                  f"calls per step: {res['hit_rate']:.0%} exact, "
                  f"{res['covered_rate']:.0%} planned (exact or nearest), "
                  f"{c['miss']} on the default heuristic")


def render_diff(d: dict[str, Any]) -> None:
    """Per device section: entries added, removed, re-chosen (~) and re-timed (t)."""
    if d["identical"]:
        console.print("plans are identical")
        return
    for s in d["sections"]:
        if s["status"] != "both":
            side = "A" if s["status"] == "only_a" else "B"
            console.print(f"[bold]{escape(s['device'])}[/]: only in {side} "
                          f"({s['entries']} entries)")
            continue
        console.print(f"[bold]{escape(s['device'])}[/]" + (
            " [yellow](kernels digest changed)[/]" if s["kernels_changed"] else ""))
        for mark, part in (("[green]+[/]", "added"), ("[red]-[/]", "removed")):
            for e in s[part]:
                console.print(f"  {mark} {e['op']} {escape(key_text(e['op'], e['key']))}: "
                              f"{escape(e['choice'])} {fmt_us(e['median_us'])}")
        for e in s["changed"]:
            console.print(f"  [yellow]~[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['a'])} {fmt_us(e['a_us'])}{' (pinned)' if e['a_pinned'] else ''}"
                          f" -> {escape(e['b'])} {fmt_us(e['b_us'])}"
                          f"{' (pinned)' if e['b_pinned'] else ''}")
        for e in s["retimed"]:
            console.print(f"  [dim]t[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {fmt_us(e['a_us'])} -> {fmt_us(e['b_us'])}")
        console.print(f"  [dim]{s['same']} unchanged[/]")



def render_validate(info: dict[str, Any], plan: Path) -> None:
    """The verdict and each section: its device, entries, whether it serves this machine."""
    console.print(f"[green]✓[/] {escape(str(plan))} is a valid dnnctl-plan/1 "
                  f"({len(info['sections'])} section(s))")
    for s in info["sections"]:
        note = (" [green](this machine)[/]" if s["this_machine"] else
                " [yellow](this machine, other kernels: stale here)[/]" if s["stale_kernels"]
                else "")
        console.print(f"  {s['index']}: {escape(s['label'])}, {s['entries']} entries{note}")


def render_merge(res: dict[str, Any]) -> None:
    """What was written, and how each conflict was resolved."""
    console.print(f"wrote {escape(res['output'])}: {res['sections']} section(s), "
                  f"{res['entries']} entries")
    for c in res["conflicts"]:
        console.print(f"  conflict {c['op']} {escape(key_text(c['op'], c['key']))}: "
                      f"{escape(c['a'])} vs {escape(c['b'])} -> kept {c['kept'].upper()}")


def render_pin(res: dict[str, Any]) -> None:
    """Each entry pinned or unpinned, with its choice and section."""
    if not res["changed"]:
        console.print("nothing to change")
    for c in res["changed"]:
        console.print(f"{'pinned' if c['pinned'] else 'unpinned'} {c['op']} "
                      f"{escape(key_text(c['op'], c['key']))}: {escape(c['choice'])} "
                      f"(section {c['section']})")


def render_report(info: dict[str, Any], png: Path | None) -> None:
    """The report written: sections, figures, PNGs."""
    figures = sum(s["figures"] for s in info["sections"])
    console.print(f"[green]✓[/] wrote {escape(info['output'])}: {len(info['sections'])} "
                  f"section(s), {figures} figures")
    if info["pngs"]:
        console.print(f"  {len(info['pngs'])} PNGs in {escape(str(png))}")
