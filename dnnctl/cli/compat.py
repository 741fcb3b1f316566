"""`dnnctl compat`: check a planned deployment, suggest working combinations, show tables.

``check`` judges the flags exactly as doctor judges a machine (exit 0 pass, 1 fail or warn
with --strict, 2 bad usage); ``suggest`` lists working combinations newest first with their
install command; ``show`` prints one matrix table, filtered.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli.compat_render import render_show, render_suggest
from dnnctl.cli.doctor_render import exit_code, render
from dnnctl.cli.options import JsonOpt, MatrixOpt, StrictOpt, json_errors
from dnnctl.cli.render import emit

app = typer.Typer(help="Query the compatibility matrix: check, suggest, show.",
                  no_args_is_help=True, rich_markup_mode="rich")

GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", help='GPU model as NVML names it ("B200", "RTX 5090") or a CC ("9.0", "sm_90").')]


@app.command("check")
def check(
    ctx: typer.Context,
    gpu: GpuOpt = None,
    driver: Annotated[str | None, typer.Option(help="Driver version, e.g. 550.54.15.")] = None,
    cuda: Annotated[str | None, typer.Option(
        help="CUDA runtime/toolkit version (also the CUDA of a --torch without +cuXYZ).")] = None,
    cudnn: Annotated[str | None, typer.Option(help="The cuDNN that will load first.")] = None,
    torch: Annotated[str | None, typer.Option(help="torch version, e.g. 2.2.0+cu121.")] = None,
    tensorflow: Annotated[str | None, typer.Option(help="TensorFlow version.")] = None,
    jax: Annotated[str | None, typer.Option(
        help="jax/jaxlib version, optionally +cuda12 / +cuda13 for the plugin.")] = None,
    cupy: Annotated[list[str] | None, typer.Option(
        help="CuPy package[==version] (repeatable: two packages is a conflict).")] = None,
    python: Annotated[str | None, typer.Option(help="Python version.")] = None,
    json_out: JsonOpt = False,
    strict: StrictOpt = False,
    matrix: MatrixOpt = None,
) -> None:
    """Judge a deployment that does not exist yet: the same findings doctor would give."""
    json_errors(ctx, json_out)
    report = api.compat_check(gpu=gpu, driver=driver, cuda=cuda, cudnn=cudnn, torch=torch,
                              tensorflow=tensorflow, jax=jax, cupy=cupy or (), python=python,
                              matrix=matrix or ())
    emit(report, json_out, render)
    raise typer.Exit(int(exit_code(report.verdict, strict)))


@app.command("suggest")
def suggest(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help='GPU model ("RTX 5090") or CC ("12.0").')],
    driver: Annotated[str | None, typer.Option(help="Keep this driver (rank by it).")] = None,
    framework: Annotated[str | None, typer.Option(
        help="Only this framework: torch, tensorflow, jax or cupy.")] = None,
    python: Annotated[str | None, typer.Option(help="Only builds for this Python.")] = None,
    json_out: JsonOpt = False,
    matrix: MatrixOpt = None,
) -> None:
    """Working combinations for a GPU, newest first, each with its install command."""
    json_errors(ctx, json_out)
    data = api.compat_suggest(gpu, driver=driver, framework=framework, python=python,
                              matrix=matrix or ())
    emit(data, json_out, render_suggest)


@app.command("show")
def show(
    ctx: typer.Context,
    table: Annotated[str, typer.Argument(
        help="gpus, archs, cuda, cudnn, torch, tensorflow, jax or cupy.")],
    filter_: Annotated[list[str] | None, typer.Option(
        "--filter", "-f", help="KEY=TEXT (substring of a field) or TEXT (any field); repeatable.")
    ] = None,
    json_out: JsonOpt = False,
    matrix: MatrixOpt = None,
) -> None:
    """Print one matrix table, every row with its certainty (and source in --json)."""
    json_errors(ctx, json_out)
    data = api.compat_show(table, filter_ or (), matrix=matrix or ())
    emit(data, json_out, render_show, table)
