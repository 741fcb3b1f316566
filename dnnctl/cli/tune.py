"""``dnnctl tune``: pick the fastest verified kernel for every problem and write a plan.

Parses the options, calls :func:`dnnctl.api.tune`, shows progress on stderr
(:mod:`dnnctl.cli.progress`) and the final table (:mod:`dnnctl.cli.tune_render`). Exit
status: 0 every problem planned, 1 some problem unplanned, 2 bad usage, 3 device
unavailable, 130 interrupted (--resume).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli.options import DeviceOpt, JsonOpt, comma_ints, comma_names, json_errors
from dnnctl.cli.progress import JsonLines, View
from dnnctl.cli.render import emit
from dnnctl.cli.tune_render import render
from dnnctl.errors import ExitCode

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
    gpu_time: Annotated[bool, typer.Option(
        "--gpu-time", help="Time the GPU's work alone, the host enqueueing ahead: for plans "
             "replayed from CUDA graphs (torch.compile mode='reduce-overhead'). Default: "
             "a call's time as an eager caller waits for it.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Tune kernels for every problem of a workload on this GPU (or CPU) and write a plan."""
    json_errors(ctx, json_out)
    if plugin:
        extra = [m for m in os.environ.get("DNNCTL_PLUGINS", "").split(",") if m.strip()]
        os.environ["DNNCTL_PLUGINS"] = ",".join(dict.fromkeys([*extra, *plugin]))
    from dnnctl.backends.registry import parse_device
    from dnnctl.tune.timer import TimingPolicy
    from dnnctl.tune.tuner import TuneOptions
    from dnnctl.workloads import WorkloadOptions

    policy = None
    if sample_ms is not None or gpu_time:
        policy = TimingPolicy.for_backend(parse_device(device)[0]).replace(
            budget_ms=sample_ms, host_ahead=gpu_time or None)
    view = JsonLines() if json_out else View()
    try:
        options = TuneOptions(
            device=device, output=output, budget_s=budget,
            candidate_timeout_s=candidate_timeout, strategy=strategy, max_evals=max_evals,
            resume=resume, deterministic=deterministic, ops=comma_names(ops),
            devices=comma_ints(devices, "--devices", "GPU indices like 0,1,2"), seed=seed,
            keep_journal=keep_journal, policy=policy)
        report = api.tune(
            workload, op=op, key=key, progress=view, ray=ray, options=options,
            workload_options=WorkloadOptions(batch, seq, dtype, layout))
    finally:
        if isinstance(view, View):
            view.close()
    emit(report, json_out, render)
    raise typer.Exit(int(ExitCode.FAIL if report.unplanned else ExitCode.OK))
