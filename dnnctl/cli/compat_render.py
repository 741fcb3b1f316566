"""Rendering of the ``dnnctl compat`` answers: combinations with their install commands,
and matrix tables (``check`` renders as doctor does: dnnctl.cli.doctor_render)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from dnnctl.cli.render import console, print_commands


def render_suggest(data: dict[str, Any]) -> None:
    """The GPU, then the working combinations newest first, notes, install commands."""
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


_LISTY = frozenset({"arch_list", "arch_uncertain", "examples", "targets", "family", "dropped",
                    "cc", "install"})


def render_show(data: dict[str, Any], table: str) -> None:
    """One matrix table, every row with its certainty; where the columns cannot all fit
    the terminal whole, each row as a block of ``column: value`` lines (a squeezed table
    cut values short without a mark: torch 1.13 read '1.1')."""
    cols = data["columns"]
    cells = [[_cell(row.get(c)) for c in cols] for row in data["rows"]]

    def width(i: int, col: str) -> int:  # list columns wrap between items
        parts = [w for r in cells for w in (r[i].split() if col in _LISTY else [r[i]])]
        return 3 + max([len(col)] + [len(w) for w in parts])

    if 1 + sum(width(i, c) for i, c in enumerate(cols)) > console.width:
        console.print(f"[bold]{escape(table)}[/] ({len(cells)} rows)")
        wide = max(len(c) for c in cols)
        for n, row in enumerate(cells, 1):
            console.print(f"[dim]# {n}[/]")
            for c, v in zip(cols, row):
                if v:
                    console.print(f"  {escape(c):<{wide}}  {escape(v)}")
        return
    out = Table(title=f"{table} ({len(data['rows'])} rows)", title_justify="left")
    for col in cols:
        out.add_column(col, overflow="fold", no_wrap=col not in _LISTY)
    for row in cells:
        out.add_row(*map(escape, row))
    console.print(out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items())
    return str(value)
