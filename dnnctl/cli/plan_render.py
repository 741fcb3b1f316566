"""Rendering of the ``dnnctl plan`` commands' results (tables that fit 80 columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.progress import short_key
from dnnctl.cli.render import console


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
                          escape(e["choice"].replace(",", ", ")), _us(e["median_us"]),
                          _x(e["speedup_vs_default"]), _x(e["speedup_vs_runner_up"]),
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
        for e in s["added"]:
            console.print(f"  [green]+[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['median_us'])}")
        for e in s["removed"]:
            console.print(f"  [red]-[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['median_us'])}")
        for e in s["changed"]:
            console.print(f"  [yellow]~[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['a'])} {_us(e['a_us'])}{' (pinned)' if e['a_pinned'] else ''}"
                          f" -> {escape(e['b'])} {_us(e['b_us'])}"
                          f"{' (pinned)' if e['b_pinned'] else ''}")
        for e in s["retimed"]:
            console.print(f"  [dim]t[/] {e['op']} {escape(key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['a_us'])} -> {_us(e['b_us'])}")
        console.print(f"  [dim]{s['same']} unchanged[/]")


def key_text(op: str, key: dict[str, Any]) -> str:
    from dnnctl.ops import registry

    return short_key(registry.get_op(op).problem(key))


def _us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"


def _x(v: float | None) -> str:
    return "—" if not v else f"{v:.2f}x"
