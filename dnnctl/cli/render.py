"""Rendering shared by every command: consoles, JSON output, the error box, the command
lists of fixes, and the formats of times, speed-ups and problem keys."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from dnnctl.errors import DnnctlError, ExitCode


class _Console(Console):
    """A closed pipe (``dnnctl ... | head``) ends the command quietly with status 0:
    the reader has what it wanted (rich's own handler exits 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        quiet_stream(sys.stderr if self.stderr else sys.stdout)
        raise SystemExit(0)


def quiet_stream(stream: Any) -> None:
    """Point ``stream`` at /dev/null so the interpreter's final flush into a closed pipe
    does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):
        pass


# rich honours NO_COLOR, and writes no colour or cursor codes when the output is not a TTY
console = _Console(highlight=False, soft_wrap=False)
err_console = _Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (plain, parseable, no rich markup)."""
    sys.stdout.write(json.dumps(data, indent=2, default=_default, sort_keys=False) + "\n")
    sys.stdout.flush()


def emit(data: Any, as_json: bool, render: Callable[..., None], *args: Any) -> None:
    """``data`` as JSON on stdout, or ``render(data, *args)`` for people."""
    if as_json:
        print_json(data)
    else:
        render(data, *args)


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
    # never hard-wrapped: paths and commands in errors and hints are copied whole
    err_console.print(f"[bold red]error[/] [dim]({exc.code})[/]: {escape(exc.message)}",
                      markup=True, soft_wrap=True)
    if exc.hint:
        err_console.print(f"  [bold]hint:[/] {escape(exc.hint)}", soft_wrap=True)


def error_status(exc: BaseException, *, as_json: bool = False) -> int:
    """Render an exception that ended a command, once, at the edge; the exit status.

    A DnnctlError shows its message and hint; Ctrl-C is 130; anything else is a bug: one
    clear line (``DNNCTL_DEBUG=1`` re-raises it for the traceback).
    """
    if isinstance(exc, DnnctlError):
        render_error(exc, as_json=as_json)
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    if os.environ.get("DNNCTL_DEBUG"):
        raise exc
    render_error(DnnctlError(f"internal error: {type(exc).__name__}: {exc}",
                             hint="this is a dnnctl bug; rerun with DNNCTL_DEBUG=1 for the "
                                  "traceback and report it", code="internal"),
                 as_json=as_json)
    return int(ExitCode.FAIL)


# a fix's text names commands in backticks, or starts with one ("pip install ... (note)")
_CMD_WORDS = ("pip", "pip3", "sudo", "apt", "apt-get", "conda", "uv", "python", "python3",
              "nvidia-smi", "dnnctl", "docker", "export", "wsl", "ln")


def _is_command(text: str) -> bool:
    """A command to copy: a known program, or a PowerShell environment assignment."""
    word = text.split()[0] if text.split() else ""
    return word in _CMD_WORDS or word.startswith("$env:")


def split_commands(text: str, start: int = 1) -> tuple[str, list[str]]:
    """(prose, commands): the commands a user must copy, taken out of ``text`` so they can
    be printed whole on lines of their own; the prose refers to them as [start], ..."""
    commands: list[str] = []

    def take(cmd: str) -> str:
        commands.append(cmd.strip())
        return f"[{start + len(commands) - 1}]"

    prose = re.sub(r"`([^`]+)`", lambda m: take(m.group(1)) if _is_command(m.group(1))
                   else m.group(0), text)
    # the command ends before "(", ";" or ", " (prose after it: never part of a command line)
    m = re.match(r"((?:" + "|".join(map(re.escape, _CMD_WORDS)) + r") [^(;]+?)(\s*(?:[(;]|, ).*|$)",
                 prose)
    if m and not commands:
        prose = "run " + take(m.group(1)) + m.group(2)
    return prose, commands


def print_commands(commands: list[tuple[str, str]]) -> None:
    """Each command on its own line, never wrapped (copy it whole), under a comment line
    saying what it fixes (harmless if pasted too)."""
    if not commands:
        return
    console.print("[bold]commands[/] [dim](one per line)[/]:")
    for i, (what, cmd) in enumerate(commands, 1):
        console.print(f"[dim]# [{i}] {escape(what)}[/]", soft_wrap=True)
        for line in wrap_command(cmd, console.width):
            console.print(line, soft_wrap=True, highlight=False, markup=False)


def wrap_command(cmd: str, width: int = 80) -> list[str]:
    """A POSIX shell command as lines of at most ``width`` columns that paste as the same
    command: broken between words with `` \\`` (the next line indented), and a word longer
    than a line (a path, a URL) inside it with a bare ``\\``, the next line at column 0
    (the shell drops a backslash-newline, outside single quotes, even within a word).
    PowerShell commands and words with single quotes are never broken inside."""
    if len(cmd) <= width or cmd.startswith("$env:") or width < 20:
        return [cmd]
    lines, cur = [], ""
    for word in cmd.split(" "):
        if cur and len(cur) + 1 + len(word) + 2 <= width:
            cur += " " + word
            continue
        if cur:
            lines.append(cur + " \\")
            cur = "    "
        while len(cur) + len(word) + 1 > width and "'" not in word:
            cut = max(word.rfind(c, 0, width - len(cur) - 1) for c in "/:,=&")
            cut = cut + 1 if cut > 0 else width - len(cur) - 1
            lines.append(cur + word[:cut] + "\\")
            cur, word = "", word[cut:]
        cur += word
    return lines + [cur]


# -- formats of values -------------------------------------------------------------------


def fmt_us(v: float | None) -> str:
    """A time in microseconds as people read it: ``12.3 us`` or ``4.56 ms``."""
    if v is None:
        return "—"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"


def fmt_x(v: float | None) -> str:
    """A speed-up factor (``1.23x``), or a dash when there is none."""
    return "—" if not v else f"{v:.2f}x"


def fmt_eta(seconds: float | None) -> str:
    """Time left as ``ETA m:ss`` (``ETA h:mm:ss`` past an hour)."""
    if seconds is None:
        return "ETA --"
    s = int(round(seconds))
    return f"ETA {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"ETA {s // 60}:{s % 60:02d}"


def short_problem(problem: Any) -> str:
    """``op`` and the key fields that differ from the op's defaults."""
    from dnnctl.workloads import short_key  # the op registry only when a problem is shown

    return f"{problem.op} {short_key(problem)}"


def key_text(op: str, key: dict[str, Any]) -> str:
    """A key as data (plan JSON) shown as :func:`short_problem` shows it, without the op."""
    from dnnctl.ops import registry
    from dnnctl.workloads import short_key

    return short_key(registry.get_op(op).problem(key))
