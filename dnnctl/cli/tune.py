"""``dnnctl tune``: pick the fastest verified kernel for every problem and write a plan.

Parses the options, calls :func:`dnnctl.api.tune`, shows progress on stderr
(:mod:`dnnctl.cli.progress`: a bar with the ETA, or JSON lines with --json) and a final table: winner, its time, speed-up over the default heuristic and over the
runner-up, candidates tried / failed by reason. Exit status: 0 every problem planned,
1 some problem unplanned, 2 bad usage, 3 device unavailable, 130 interrupted (--resume).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.options import DeviceOpt, JsonOpt
from dnnctl.cli.progress import JsonLines, View, short_problem
from dnnctl.cli.render import console, print_json
from dnnctl.errors import ExitCode, UsageError

HELP_EPILOG = ("Examples: dnnctl tune  |  dnnctl tune resnet50 --batch 32  |  "
               "dnnctl tune my_workload.yaml -o plan.yaml  |  "
               "dnnctl tune --op matmul --key m=4096,n=4096,k=4096,dtype=float16")


def register(app: typer.Typer) -> None:
    """Add the `tune` command to the root app."""
    app.command("tune", epilog=HELP_EPILOG)(tune)


def tune(
    ctx: typer.Context,
    workload: Annotated[str | None, typer.Argument(
        metavar="[WORKLOAD|FILE]",
        help="Bundled workload (resnet50, mobilenet_v2, bert_base, vit_b16, llama7b_layer, "
             "default; options as name:batch=8,seq=128) or a dnnctl-workload/1 file. "
             "Default: a small workload that tunes in seconds.")] = None,
    op: Annotated[str | None, typer.Option("--op", help="Tune one problem of this op.")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="The problem key for --op, e.g. m=512,n=512,k=512,dtype=float16 "
                      "(lists: stride=2,2 or 2x2); dtype / layout default to float16 NHWC "
                      "on a GPU, float32 NCHW on the CPU.")] = None,
    device: DeviceOpt = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Plan file to write/update.")
                      ] = Path("plan.yaml"),
    budget: Annotated[float | None, typer.Option(
        "--budget", metavar="SECONDS", min=0.0,
        help="Hard time limit for the whole run: it stops within one measurement; "
             "problems cut short are marked partial (--resume continues them).")] = None,
    candidate_timeout: Annotated[float, typer.Option(
        "--candidate-timeout", metavar="S", min=0.1,
        help="Limit for one candidate (build + verify + time); a hang is killed.")] = 120.0,
    strategy: Annotated[str, typer.Option(
        "--strategy", help="Search strategy: auto (exhaustive for small spaces, else local "
                           "search), exhaustive, random or local.")] = "auto",
    max_evals: Annotated[int | None, typer.Option(
        "--max-evals", min=1, help="At most this many candidates per problem.")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted run from its journal; keep entries already "
                         "in the plan.")] = False,
    deterministic: Annotated[bool, typer.Option(
        "--deterministic", help="Exclude non-deterministic variants (e.g. split-K atomics).")
    ] = False,
    ops: Annotated[str | None, typer.Option(
        "--ops", help="Only these ops of the workload, e.g. conv2d,matmul.")] = None,
    devices: Annotated[str | None, typer.Option(
        "--devices", help="Tune on several identical GPUs in parallel, e.g. 0,1,2,3.")] = None,
    batch: Annotated[int | None, typer.Option("--batch", min=1, help="Workload batch size.")
                     ] = None,
    seq: Annotated[int | None, typer.Option("--seq", min=1, help="Workload sequence length.")
                   ] = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="Workload dtype: float16, bfloat16 or float32.")] = None,
    layout: Annotated[str | None, typer.Option("--layout", help="Workload layout: NCHW / NHWC.")
                      ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of inputs and random search.")] = 0,
    sample_ms: Annotated[float | None, typer.Option(
        "--sample-ms", min=0.1, help="Sampling time per candidate (default: 50 on a GPU, 20 "
                                     "on the CPU); leaders are re-timed on top.")] = None,
    plugin: Annotated[list[str] | None, typer.Option(
        "--plugin", metavar="MODULE",
        help="Import MODULE (registering extra variants) here and in the workers; "
             "same as $DNNCTL_PLUGINS.")] = None,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="[ADDRESS]",
        help="Spread the problems over a Ray cluster's GPUs, one task per problem (extra "
             "dnnctl[ray]); alone: $RAY_ADDRESS or a local cluster.")] = None,
    keep_journal: Annotated[bool, typer.Option(
        "--keep-journal", help="Keep the journal after a complete run.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Tune kernels for every problem of a workload on this GPU (or CPU) and write a plan."""
    if json_out:
        ctx.meta["dnnctl.json"] = True
    if plugin:
        extra = [m for m in os.environ.get("DNNCTL_PLUGINS", "").split(",") if m.strip()]
        os.environ["DNNCTL_PLUGINS"] = ",".join(dict.fromkeys([*extra, *plugin]))
    from dnnctl import api
    from dnnctl.backends.registry import parse_device
    from dnnctl.tune.timer import TimingPolicy
    from dnnctl.tune.tuner import TuneOptions

    policy = None
    if sample_ms is not None:
        policy = TimingPolicy.for_backend(parse_device(device)[0]).replace(budget_ms=sample_ms)
    view = JsonLines() if json_out else View()
    try:
        options = TuneOptions(
            device=device, output=output, budget_s=budget,
            candidate_timeout_s=candidate_timeout, strategy=strategy, max_evals=max_evals,
            resume=resume, deterministic=deterministic, ops=_names(ops),
            devices=_ints(devices), seed=seed, keep_journal=keep_journal, policy=policy)
        report = api.tune(
            workload, op=op, key=key, progress=view, ray=ray, options=options,
            workload_options={"batch": batch, "seq": seq, "dtype": dtype, "layout": layout})
    finally:
        if isinstance(view, View):
            view.close()
    if json_out:
        print_json(report.to_dict())
    else:
        render(report)
    raise typer.Exit(int(ExitCode.FAIL if report.unplanned else ExitCode.OK))


def _names(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _ints(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UsageError(f"--devices {text!r} must be GPU indices like 0,1,2") from None


# -- final table --------------------------------------------------------------------------


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
        table.add_row(problem, winner, _us(e.stats.median_us) if e.stats else "—",
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


def _us(v: float) -> str:
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"
