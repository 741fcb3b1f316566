"""Options shared by several commands, as Annotated aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dnnctl.errors import UsageError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DeviceOpt = Annotated[
    str | None,
    typer.Option("--device", "-d", help="cuda:N, cpu, or auto (the GPU if present, else cpu)."),
]
PlanPathArg = Annotated[Path, typer.Argument(help="A dnnctl-plan/1 YAML file.")]
MatrixOpt = Annotated[list[Path] | None, typer.Option(
    "--matrix", metavar="EXTRA.yaml",
    help="Matrix overlay adding or overriding rows (repeatable; also $DNNCTL_MATRIX).")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 on warnings too.")]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="File to write.")]


def json_errors(ctx: typer.Context, on: bool) -> None:
    """With ``--json``, errors render as JSON too (the root app reads this flag)."""
    if on:
        ctx.meta["dnnctl.json"] = True  # click shares ``meta`` with every nested context


def comma_names(text: str | None) -> tuple[str, ...] | None:
    """``a,b`` -> ("a", "b"); None when empty."""
    if not text:
        return None
    return tuple(t.strip() for t in text.split(",") if t.strip())


def comma_ints(text: str | None, flag: str, what: str) -> tuple[int, ...] | None:
    """``0,1,2`` -> (0, 1, 2); None when empty; a UsageError naming ``flag`` otherwise."""
    if not text:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r} must be {what}") from None
