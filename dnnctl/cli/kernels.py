"""``dnnctl kernels``: the bundled ops, their variants and parameter spaces."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from dnnctl.cli.options import JsonOpt
from dnnctl.cli.render import console, print_json

app = typer.Typer(help="List the bundled ops, algorithm variants and parameter spaces.",
                  no_args_is_help=True)


@app.command("list")
def list_kernels(
    op: Annotated[str | None, typer.Option("--op", help="Only this op.")] = None,
    backend: Annotated[str | None, typer.Option(help="Only 'cupy' or 'numpy'.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show every op, variant and parameter space."""
    from dnnctl import api

    rows = api.list_kernels(op=op, backend=backend)
    if json_out:
        print_json({"schema": "dnnctl-kernels/1", "variants": rows})
        return
    table = Table(title="dnnctl kernels", show_lines=False)
    for col in ("op", "backend", "variant", "parameters", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        params = "  ".join(f"{k}∈{{{','.join(map(str, v))}}}" for k, v in r["params"].items())
        table.add_row(r["op"], r["backend"], r["variant"] + ("" if r["deterministic"] else " *"),
                      params or "—", r["source"] or "—")
    console.print(table)
    console.print("[dim]* non-deterministic (excluded by tune --deterministic)[/]")
