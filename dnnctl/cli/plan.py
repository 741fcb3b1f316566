"""``dnnctl plan``: show, validate, diff, merge, coverage and pin plan files.

Exit status: 0 success; 1 ``diff --exit-code`` found differences or ``coverage
--fail-under`` was not met; 2 a malformed plan / workload or bad usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli import plan_render
from dnnctl.cli.options import JsonOpt, PlanPathArg, json_errors
from dnnctl.cli.render import emit
from dnnctl.errors import ExitCode

app = typer.Typer(help="Inspect, compare, merge and pin plan files (dnnctl-plan/1).",
                  no_args_is_help=True)

SectionOpt = Annotated[int | None, typer.Option(
    "--section", min=0, help="Section index (see 'plan show'); default: the only one or this "
                             "machine's.")]


@app.command("show")
def show(ctx: typer.Context, plan: PlanPathArg, json_out: JsonOpt = False,
         op: Annotated[str | None, typer.Option("--op", help="Only entries of this op.")] = None,
         ) -> None:
    """List every section and entry: the choice, its time and speed-ups, pins."""
    json_errors(ctx, json_out)
    emit(api.plan_show(plan, op=op), json_out, plan_render.render_show, plan)


@app.command("validate")
def validate(ctx: typer.Context, plan: PlanPathArg, json_out: JsonOpt = False) -> None:
    """Check a plan strictly (schema, types, ranges, ops, variants, parameters)."""
    json_errors(ctx, json_out)
    emit(api.plan_validate(plan), json_out, plan_render.render_validate, plan)


@app.command("diff")
def diff(ctx: typer.Context, a: PlanPathArg, b: PlanPathArg, json_out: JsonOpt = False,
         exit_code: Annotated[bool, typer.Option(
             "--exit-code", help="Exit 1 when the plans differ (like git diff).")] = False,
         ) -> None:
    """What changed from plan A to plan B: entries added, removed, re-chosen, re-timed."""
    json_errors(ctx, json_out)
    d = api.plan_diff(a, b)
    emit(d, json_out, plan_render.render_diff)
    if exit_code and not d["identical"]:
        raise typer.Exit(int(ExitCode.FAIL))


@app.command("merge")
def merge(ctx: typer.Context, a: PlanPathArg, b: PlanPathArg,
          output: Annotated[Path, typer.Option("--output", "-o", help="Merged plan to write.")],
          prefer: Annotated[str, typer.Option(
              "--prefer", help="On conflicts: faster, newer, a or b (pinned entries always "
                               "win).")] = "faster",
          json_out: JsonOpt = False) -> None:
    """Merge two plans: sections of other devices are added, matching sections merged."""
    json_errors(ctx, json_out)
    emit(api.plan_merge(a, b, output, prefer), json_out, plan_render.render_merge)


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
    json_errors(ctx, json_out)
    from dnnctl.workloads import WorkloadOptions

    res = api.plan_coverage(plan, workload, section, WorkloadOptions(batch, seq, dtype, layout))
    emit(res, json_out, plan_render.render_coverage, plan)
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
    json_errors(ctx, json_out)
    res = api.plan_pin(plan, op, key, variant=variant, params=param, unpin=unpin,
                       all_entries=all_entries, section=section)
    emit(res, json_out, plan_render.render_pin)


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
    json_errors(ctx, json_out)
    info = api.plan_report(plan, output, png_dir=png, against=against, ceilings=ceilings)
    emit(info, json_out, plan_render.render_report, png)
