"""``dnnctl plan``: show, validate, diff, merge, coverage and pin plan files.

Exit status: 0 success; 1 ``diff --exit-code`` found differences or ``coverage
--fail-under`` was not met; 2 a malformed plan / workload or bad usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.options import JsonOpt, PlanPathArg
from dnnctl.cli.progress import short_key
from dnnctl.cli.render import console, print_json
from dnnctl.errors import ExitCode

app = typer.Typer(help="Inspect, compare, merge and pin plan files (dnnctl-plan/1).",
                  no_args_is_help=True)

SectionOpt = Annotated[int | None, typer.Option(
    "--section", min=0, help="Section index (see 'plan show'); default: the only one or this "
                             "machine's.")]


def _json_mode(ctx: typer.Context, json_out: bool) -> None:
    if json_out:
        ctx.find_root().meta["dnnctl.json"] = True


@app.command("show")
def show(ctx: typer.Context, plan: PlanPathArg, json_out: JsonOpt = False,
         op: Annotated[str | None, typer.Option("--op", help="Only entries of this op.")] = None,
         ) -> None:
    """List every section and entry: the choice, its time and speed-ups, pins."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    info = api.plan_show(plan)
    if op:
        for s in info["sections"]:
            s["entries"] = [e for e in s["entries"] if e["op"] == op]
    if json_out:
        print_json(info)
        return
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
            table.add_row(escape(f"{e['op']} {_key_text(e['op'], e['key'])}"),
                          escape(e["choice"].replace(",", ", ")), _us(e["median_us"]),
                          _x(e["speedup_vs_default"]), _x(e["speedup_vs_runner_up"]),
                          "yes" if e["pinned"] else "")
        console.print(table)


@app.command("validate")
def validate(ctx: typer.Context, plan: PlanPathArg, json_out: JsonOpt = False) -> None:
    """Check a plan strictly (schema, types, ranges, ops, variants, parameters)."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    info = api.plan_validate(plan)
    if json_out:
        print_json(info)
        return
    console.print(f"[green]✓[/] {escape(str(plan))} is a valid dnnctl-plan/1 "
                  f"({len(info['sections'])} section(s))")
    for s in info["sections"]:
        note = (" [green](this machine)[/]" if s["this_machine"] else
                " [yellow](this machine, other kernels: stale here)[/]" if s["stale_kernels"]
                else "")
        console.print(f"  {s['index']}: {escape(s['label'])}, {s['entries']} entries{note}")


@app.command("diff")
def diff(ctx: typer.Context, a: PlanPathArg, b: PlanPathArg, json_out: JsonOpt = False,
         exit_code: Annotated[bool, typer.Option(
             "--exit-code", help="Exit 1 when the plans differ (like git diff).")] = False,
         ) -> None:
    """What changed from plan A to plan B: entries added, removed, re-chosen, re-timed."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    d = api.plan_diff(a, b)
    if json_out:
        print_json(d)
    else:
        _render_diff(d)
    if exit_code and not d["identical"]:
        raise typer.Exit(int(ExitCode.FAIL))


def _render_diff(d: dict[str, Any]) -> None:
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
            console.print(f"  [green]+[/] {e['op']} {escape(_key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['median_us'])}")
        for e in s["removed"]:
            console.print(f"  [red]-[/] {e['op']} {escape(_key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['median_us'])}")
        for e in s["changed"]:
            console.print(f"  [yellow]~[/] {e['op']} {escape(_key_text(e['op'], e['key']))}: "
                          f"{escape(e['a'])} {_us(e['a_us'])}{' (pinned)' if e['a_pinned'] else ''}"
                          f" -> {escape(e['b'])} {_us(e['b_us'])}"
                          f"{' (pinned)' if e['b_pinned'] else ''}")
        for e in s["retimed"]:
            console.print(f"  [dim]t[/] {e['op']} {escape(_key_text(e['op'], e['key']))}: "
                          f"{escape(e['choice'])} {_us(e['a_us'])} -> {_us(e['b_us'])}")
        console.print(f"  [dim]{s['same']} unchanged[/]")


@app.command("merge")
def merge(ctx: typer.Context, a: PlanPathArg, b: PlanPathArg,
          output: Annotated[Path, typer.Option("--output", "-o", help="Merged plan to write.")],
          prefer: Annotated[str, typer.Option(
              "--prefer", help="On conflicts: faster, newer, a or b (pinned entries always "
                               "win).")] = "faster",
          json_out: JsonOpt = False) -> None:
    """Merge two plans: sections of other devices are added, matching sections merged."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    res = api.plan_merge(a, b, output, prefer)
    if json_out:
        print_json(res)
        return
    console.print(f"wrote {escape(res['output'])}: {res['sections']} section(s), "
                  f"{res['entries']} entries")
    for c in res["conflicts"]:
        console.print(f"  conflict {c['op']} {escape(_key_text(c['op'], c['key']))}: "
                      f"{escape(c['a'])} vs {escape(c['b'])} -> kept {c['kept'].upper()}")


@app.command("coverage")
def coverage(ctx: typer.Context, plan: PlanPathArg,
             workload: Annotated[str, typer.Argument(
                 metavar="WORKLOAD|FILE", help="Bundled workload (name[:opt=v,...]) or file.")],
             section: SectionOpt = None,
             batch: Annotated[int | None, typer.Option("--batch", min=1)] = None,
             seq: Annotated[int | None, typer.Option("--seq", min=1)] = None,
             dtype: Annotated[str | None, typer.Option("--dtype")] = None,
             layout: Annotated[str | None, typer.Option("--layout")] = None,
             fail_under: Annotated[float | None, typer.Option(
                 "--fail-under", min=0.0, max=100.0,
                 help="Exit 1 if fewer than this % of calls hit an exact entry.")] = None,
             json_out: JsonOpt = False) -> None:
    """Which problems of a workload the plan hits exactly, falls back on, or misses."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    res = api.plan_coverage(plan, workload, section, {"batch": batch, "seq": seq,
                                                      "dtype": dtype, "layout": layout})
    if json_out:
        print_json(res)
    else:
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
            table.add_row(escape(f"{r['op']} {_key_text(r['op'], r['key'])}"),
                          str(r["count"]), marks[r["outcome"]],
                          escape((r["choice"] or "default heuristic").replace(",", ", ")))
        console.print(table)
        t, c = res["totals"], res["calls"]
        console.print(f"problems: {t['hit']} hit, {t['fallback']} fallback, {t['miss']} miss; "
                      f"calls per step: {res['hit_rate']:.0%} exact, "
                      f"{res['covered_rate']:.0%} planned (exact or nearest), "
                      f"{c['miss']} on the default heuristic")
    if fail_under is not None and res["hit_rate"] * 100 < fail_under:
        raise typer.Exit(int(ExitCode.FAIL))


@app.command("pin")
def pin(ctx: typer.Context, plan: PlanPathArg,
        op: Annotated[str | None, typer.Option("--op", help="The entry's op.")] = None,
        key: Annotated[str | None, typer.Option("--key", help="The entry's key, k=v,...")
                       ] = None,
        variant: Annotated[str | None, typer.Option(
            "--variant", help="Set the choice to this variant (validated).")] = None,
        param: Annotated[str | None, typer.Option(
            "--param", help="Its parameters, k=v,... (with --variant).")] = None,
        all_entries: Annotated[bool, typer.Option("--all", help="Every entry of the section.")
                               ] = False,
        unpin: Annotated[bool, typer.Option("--unpin", help="Remove the pin instead.")] = False,
        section: SectionOpt = None, json_out: JsonOpt = False) -> None:
    """Pin entries so re-tuning keeps them (optionally choosing the variant yourself)."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    res = api.plan_pin(plan, op, key, variant=variant, params=param, unpin=unpin,
                       all_entries=all_entries, section=section)
    if json_out:
        print_json(res)
        return
    if not res["changed"]:
        console.print("nothing to change")
    for c in res["changed"]:
        console.print(f"{'pinned' if c['pinned'] else 'unpinned'} {c['op']} "
                      f"{escape(_key_text(c['op'], c['key']))}: {escape(c['choice'])} "
                      f"(section {c['section']})")


def _key_text(op: str, key: dict[str, Any]) -> str:
    from dnnctl.ops import registry

    return short_key(registry.get_op(op).problem(key))


def _us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"


def _x(v: float | None) -> str:
    return "—" if not v else f"{v:.2f}x"


@app.command("report", epilog="Example: dnnctl plan report plan.yaml -o report.html "
                              "--png figures/ --against old.yaml")
def report(
    ctx: typer.Context, plan: PlanPathArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")
                      ] = Path("report.html"),
    png: Annotated[Path | None, typer.Option(
        "--png", metavar="DIR", help="Also write every figure as a PNG into DIR.")] = None,
    against: Annotated[Path | None, typer.Option(
        "--against", metavar="OLD", help="Show what changed against this plan.")] = None,
    ceilings: Annotated[str | None, typer.Option(
        "--ceilings", metavar="GBPS,TFLOPS",
        help="Measured ceilings for the roofline, e.g. 4249,634.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write one self-contained HTML report with figures (needs dnnctl[plots])."""
    _json_mode(ctx, json_out)
    from dnnctl import api

    info = api.plan_report(plan, output, png_dir=png, against=against, ceilings=ceilings)
    if json_out:
        print_json(info)
        return
    figures = sum(s["figures"] for s in info["sections"])
    console.print(f"[green]✓[/] wrote {escape(info['output'])}: {len(info['sections'])} "
                  f"section(s), {figures} figures")
    if info["pngs"]:
        console.print(f"  {len(info['pngs'])} PNGs in {escape(str(png))}")
