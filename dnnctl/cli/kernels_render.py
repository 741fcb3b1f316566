"""Rendering of ``dnnctl kernels list``: one table per op (80 columns)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from dnnctl.cli.render import console


def render(data: dict[str, Any]) -> None:
    """Notes, then every op's variants and parameter spaces (or why none matched)."""
    rows = data["variants"]
    for note in data["notes"]:
        console.print(f"[dim]note: {escape(note)}[/]")
    if not rows:
        console.print(f"[yellow]no kernels match: {escape(data['why_empty'])}[/]")
        return
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
