"""`dnnctl tune` (being written; see the issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `tune` command to the root app."""
