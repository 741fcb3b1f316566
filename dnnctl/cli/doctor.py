"""`dnnctl doctor` (being written; see the issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `doctor` command to the root app."""
