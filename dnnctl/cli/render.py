"""Rendering shared by every command: consoles, JSON output and the error box."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from dnnctl.errors import DnnctlError

console = Console(highlight=False, soft_wrap=False)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (plain, parseable, no rich markup)."""
    sys.stdout.write(json.dumps(data, indent=2, default=_default, sort_keys=False) + "\n")
    sys.stdout.flush()


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def render_error(exc: DnnctlError, *, as_json: bool = False) -> None:
    """Show a dnnctl error once, at the edge: what is wrong and how to fix it."""
    if as_json:
        print_json({"error": exc.to_dict()})
        return
    # messages quote user input and names like dnnctl[cuda13]: never read them as markup
    # soft_wrap: a long file path stays on one line, so it can be copied (and grepped)
    err_console.print(f"[bold red]error[/] [dim]({exc.code})[/]: {escape(exc.message)}",
                      markup=True, soft_wrap=True)
    if exc.hint:
        err_console.print(f"  [bold]hint:[/] {escape(exc.hint)}", soft_wrap=True)
