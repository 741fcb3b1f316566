"""``dnnctl kernels``: the bundled ops, their variants and parameter spaces."""

from __future__ import annotations

from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli.kernels_render import render
from dnnctl.cli.options import JsonOpt, json_errors
from dnnctl.cli.render import emit

app = typer.Typer(help="List the bundled ops, algorithm variants and parameter spaces.",
                  no_args_is_help=True)


@app.command("list")
def list_kernels(
    ctx: typer.Context,
    op: Annotated[str | None, typer.Option(
        "--op", help="Only this op (or the op of a function: gelu -> activation).")] = None,
    backend: Annotated[str | None, typer.Option(help="Only 'cupy' or 'numpy'.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show every op, variant and parameter space."""
    json_errors(ctx, json_out)
    data = api.kernels_listing(op=op, backend=backend)
    emit(data, json_out, render)
    if not data["variants"]:
        raise typer.Exit(1)
