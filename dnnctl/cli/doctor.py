"""``dnnctl doctor``: will this driver / CUDA / cuDNN / framework / GPU combination work?

Parses the options, calls :func:`dnnctl.api.doctor` and renders the report
(dnnctl.cli.doctor_render) or prints ``dnnctl-doctor/1`` JSON. Exit status: 0 pass, 1 fail
(or warn with --strict), 2 bad usage or an unreadable file. The plain forms also run
without typer (dnnctl.cli.fast): this definition stays the one for help and usage errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli.doctor_render import exit_code, render, show_timings
from dnnctl.cli.options import JsonOpt, MatrixOpt, StrictOpt, json_errors
from dnnctl.cli.render import print_json


def register(app: typer.Typer) -> None:
    """Add the `doctor` command to the root app."""
    app.command("doctor")(doctor)


def doctor(
    ctx: typer.Context,
    json_out: JsonOpt = False,
    strict: StrictOpt = False,
    deep: Annotated[bool, typer.Option(
        "--deep", help="Also ask each installed framework (imports it in a subprocess).")
    ] = False,
    save: Annotated[Path | None, typer.Option(
        "--save", metavar="ENV.yaml", help="Write the snapshot (dnnctl-env/1) to this file.")
    ] = None,
    from_file: Annotated[Path | None, typer.Option(
        "--from", metavar="ENV.yaml",
        help="Judge a saved or hand-written snapshot instead of this machine.")] = None,
    matrix: MatrixOpt = None,
    deep_timeout: Annotated[float | None, typer.Option(
        "--deep-timeout", metavar="SECONDS",
        help="Time limit of each --deep framework child (default 60; also "
        "$DNNCTL_DEEP_TIMEOUT).")] = None,
    timings: Annotated[bool, typer.Option(
        "--timings", help="Print wall ms per probe to stderr (also $DNNCTL_PROFILE=1; "
        "with --json also under \"timings\").")] = False,
    error: Annotated[list[str] | None, typer.Option(
        "--error", metavar="TEXT", help="An error message you saw, verbatim: what it means and "
        "its cause here (repeatable; snapshot field errors).")] = None,
    error_file: Annotated[list[Path] | None, typer.Option(
        "--error-file", metavar="LOG", help="A log or traceback: the lines the error catalogue "
        "recognizes are judged as --error (repeatable).")] = None,
) -> None:
    """Check the driver, GPUs, CUDA, cuDNN and frameworks, and say exactly what to change."""
    json_errors(ctx, json_out)
    from dnnctl.doctor import timing

    if timings:
        timing.enable()
    report = api.doctor(from_file=from_file, deep=deep, matrix=matrix or (), save=save,
                        deep_timeout=deep_timeout, errors=error or (),
                        error_files=error_file or ())
    if json_out:
        print_json(report.to_dict())
    else:
        with timing.span("render (rich)"):
            render(report, saved=save)
    show_timings()
    raise typer.Exit(int(exit_code(report.verdict, strict)))


__all__ = ["doctor", "exit_code", "register", "render"]
