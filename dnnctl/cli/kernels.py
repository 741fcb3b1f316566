"""``dnnctl kernels``: the bundled ops, their variants and parameter spaces."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.options import JsonOpt
from dnnctl.cli.render import console, print_json

app = typer.Typer(help="List the bundled ops, algorithm variants and parameter spaces.",
                  no_args_is_help=True)


@app.command("list")
def list_kernels(
    op: Annotated[str | None, typer.Option(
        "--op", help="Only this op (or the op of a function: gelu -> activation).")] = None,
    backend: Annotated[str | None, typer.Option(help="Only 'cupy' or 'numpy'.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show every op, variant and parameter space."""
    from dnnctl import api

    data = api.kernels_listing(op=op, backend=backend)
    rows = data["variants"]
    if json_out:
        print_json(data)
        raise typer.Exit(0 if rows else 1)
    for note in data["notes"]:
        console.print(f"[dim]note: {escape(note)}[/]")
    if not rows:
        console.print(f"[yellow]no kernels match: {escape(data['why_empty'])}[/]")
        raise typer.Exit(1)
    by_op: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    for name, op_rows in by_op.items():  # one table per op: fits 80 columns
        table = Table(title=f"[bold]{name}[/]", title_justify="left", box=box.SIMPLE_HEAD,
                      pad_edge=False)
        for col in ("backend", "variant", "parameters", "source"):
            table.add_column(col, overflow="fold", no_wrap=col == "variant",
                             min_width=26 if col == "parameters" else None)
        for r in op_rows:
            params = "\n".join(f"{k}∈{{{','.join(map(str, v))}}}"
                                for k, v in r["params"].items())
            table.add_row(r["backend"], r["variant"] + ("" if r["deterministic"] else " *"),
                          params or "—", (r["source"] or "—").split("/")[-1])
        console.print(table)
    console.print("[dim]* non-deterministic (excluded by tune --deterministic); sources "
                  "under kernels/<op>/[/]")
