"""Root of the ``dnnctl`` command line.

Exit codes (see dnnctl.errors.ExitCode): 0 success / doctor pass; 1 a check failed (doctor
fail, or warn with --strict; tune left problems unplanned); 2 bad usage or unreadable input;
3 the requested device or backend is unavailable; 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from dnnctl._version import __version__
from dnnctl.cli.render import error_status, quiet_stream
from dnnctl.errors import ExitCode


def _click_errors() -> tuple[type[BaseException], ...]:
    """Usage errors click renders itself (exit 2): click's, and those of the click copy
    newer typer releases vendor (both may be installed side by side)."""
    found: list[type[BaseException]] = []
    for mod in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(__import__(mod, fromlist=["ClickException"]).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


_ClickError = _click_errors()


def _optional_values(args: list[str]) -> list[str]:
    """``--ray`` takes an optional ADDRESS: alone (or before a non-address) it is ``--ray=``
    (Ray's default: $RAY_ADDRESS or a local cluster)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg == "--ray":
            nxt = out[i + 1] if i + 1 < len(out) else ""
            if nxt.startswith("-") or not (":" in nxt or nxt in ("auto", "local")):
                out[i] = "--ray="
    return out


class _Root(TyperGroup):
    """Renders every DnnctlError once, with its exit code (also under CliRunner)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _optional_values(args))

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """With ``--json``, click's own usage errors (an unknown flag, a bad value, an
        unreadable path) are JSON on stdout too, as dnnctl's errors are; exit 2."""
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or "--json" not in argv:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except _ClickError as exc:
            from dnnctl.cli.render import render_error
            from dnnctl.errors import UsageError

            render_error(UsageError(exc.format_message()), as_json=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            finally:  # a closed pipe shows here when the output was buffered
                _flush_stdout()
        except BrokenPipeError:  # `dnnctl ... | head`: the reader has what it wanted
            quiet_stream(sys.stdout)
            raise typer.Exit(int(ExitCode.OK)) from None
        except (typer.Exit, typer.Abort, *_ClickError):
            raise  # click renders its own usage errors (exit 2)
        except (Exception, KeyboardInterrupt) as exc:  # DnnctlError, Ctrl-C or a bug
            raise typer.Exit(error_status(exc, as_json=bool(ctx.meta.get("dnnctl.json")))
                             ) from None


def _new_app() -> typer.Typer:
    return typer.Typer(
        name="dnnctl",
        cls=_Root,
        help="Doctor for the GPU deep-learning stack, cuDNN-class kernels, per-shape autotuning.",
        rich_markup_mode="rich",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dnnctl {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """dnnctl: will this GPU stack work, and which kernel is fastest for each shape."""


# name -> how the command file adds itself ("register": a command; "app": a sub-group)
COMMANDS = {"doctor": "register", "compat": "app", "kernels": "app", "tune": "register",
            "plan": "app", "workload": "app"}


def build_app(only: str | None = None) -> typer.Typer:
    """The root app with every command, or with ``only`` one of them: a command file is
    imported only when its command may run, so `dnnctl doctor` does not import the tuner's."""
    root = _new_app()
    root.callback()(_root)
    for name, how in COMMANDS.items():
        if only is not None and name != only:
            continue
        mod = importlib.import_module(f"dnnctl.cli.{name}")
        if how == "register":
            mod.register(root)
        else:
            root.add_typer(mod.app, name=name)
    return root


def __getattr__(name: str) -> Any:
    if name == "app":  # the full app (tests, help); built on first use
        globals()["app"] = full = build_app()
        return full
    raise AttributeError(name)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError):  # a replaced or closed stream (tests): nothing to do
        pass


def main() -> None:
    """Console-script entry point."""
    first = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        build_app(first if first in COMMANDS else None)()
    except BrokenPipeError:
        quiet_stream(sys.stdout)
        sys.exit(int(ExitCode.OK))
