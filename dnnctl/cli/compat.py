"""`dnnctl compat`: check a planned deployment, suggest working combinations, show tables.

``check`` judges the flags exactly as doctor judges a machine (exit 0 pass, 1 fail or warn
with --strict, 2 bad usage); ``suggest`` lists working combinations newest first with their
install command; ``show`` prints one matrix table, filtered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.options import JsonOpt
from dnnctl.cli.render import console, print_commands, print_json

app = typer.Typer(help="Query the compatibility matrix: check, suggest, show.",
                  no_args_is_help=True, rich_markup_mode="rich")

MatrixOpt = Annotated[list[Path] | None, typer.Option(
    "--matrix", metavar="EXTRA.yaml",
    help="Matrix overlay adding or overriding rows (repeatable; also $DNNCTL_MATRIX).")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", help='GPU model as NVML names it ("B200", "RTX 5090") or a CC ("9.0", "sm_90").')]


def _json(ctx: typer.Context, on: bool) -> None:
    if on:
        ctx.meta["dnnctl.json"] = True  # errors render as JSON too


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
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on warnings too.")] = False,
    matrix: MatrixOpt = None,
) -> None:
    """Judge a deployment that does not exist yet: the same findings doctor would give."""
    _json(ctx, json_out)
    from dnnctl import api
    from dnnctl.cli.doctor_render import exit_code, render

    report = api.compat_check(gpu=gpu, driver=driver, cuda=cuda, cudnn=cudnn, torch=torch,
                              tensorflow=tensorflow, jax=jax, cupy=cupy or (), python=python,
                              matrix=matrix or ())
    if json_out:
        print_json(report.to_dict())
    else:
        render(report)
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
    _json(ctx, json_out)
    from dnnctl import api

    data = api.compat_suggest(gpu, driver=driver, framework=framework, python=python,
                              matrix=matrix or ())
    if json_out:
        print_json(data)
        return
    head = f"[bold]{escape(data['gpu'])}[/]: compute capability {data['compute_capability']} " \
           f"({escape(data['architecture'])})"
    if data.get("gpu_min_driver"):
        head += f", GPU needs driver >= {data['gpu_min_driver']}"
    console.print(head)
    commands: list[tuple[str, str]] = []
    _combo_table("builds with code for this GPU, newest first", data["combinations"], commands)
    if data["ptx_only"]:
        _combo_table("reach it only through PTX JIT (slow first start)", data["ptx_only"][:8],
                     commands)
    for note in data["notes"]:
        console.print(f"[dim]· {escape(note)}[/]")
    print_commands(commands)


def _combo_table(title: str, combos: list[dict[str, Any]],
                 commands: list[tuple[str, str]]) -> None:
    """The combinations as a table; their install commands (too long for a table cell
    at 80 columns) go to ``commands``, printed whole afterwards, referred to as [n]."""
    if not combos:
        console.print(f"[yellow]no {escape(title.split(',')[0])}[/]")
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in ("#", "framework", "version", "build", "CUDA", "cuDNN", "driver"):
        table.add_column(col, overflow="fold")
    for c in combos:
        build = c.get("variant") or c.get("plugin") or c.get("package") or ""
        driver = c["driver"] if c["driver"] != "unknown" or not c.get("min_driver") \
            else f">={c['min_driver']}"
        commands.append((f"{c['framework']} {c['version']} {build}".strip(), c["install"]))
        table.add_row(str(len(commands)), c["framework"], str(c["version"]), build,
                      str(c["cuda"]), str(c.get("cudnn") or ""), driver)
    console.print(table)


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
    _json(ctx, json_out)
    from dnnctl import api

    data = api.compat_show(table, filter_ or (), matrix=matrix or ())
    if json_out:
        print_json(data)
        return
    out = Table(title=f"{table} ({len(data['rows'])} rows)", title_justify="left")
    for col in data["columns"]:
        listy = col in ("arch_list", "arch_uncertain", "examples", "targets", "family", "dropped",
                        "cc", "install")
        out.add_column(col, overflow="fold", no_wrap=not listy)
    for row in data["rows"]:
        out.add_row(*(escape(_cell(row.get(c))) for c in data["columns"]))
    console.print(out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items())
    return str(value)
