"""`dnnctl plan` (being written; see the issue)."""

from __future__ import annotations

import typer

app = typer.Typer(help="plan", no_args_is_help=True)
