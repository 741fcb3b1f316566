"""`dnnctl doctor` without typer: the one command that must start fast on a broken server.

Importing typer (and the pydantic it loads for parameter coercion) costs more than the
whole doctor run. :func:`run` handles the plain forms (``--json``, ``--strict``, ``--deep``,
``--save F``, ``--from F``, ``--matrix F``..., ``--error TEXT``..., ``--error-file F``..., also
``--opt=F``) with the same library call,
the same rendering and the same exit codes as dnnctl.cli.doctor; anything else (``-h``, an
unknown or misspelled option, a missing value) returns None and typer handles it, so help
and usage errors have one definition.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FLAGS = {"--json": "json_out", "--strict": "strict", "--deep": "deep", "--timings": "timings"}
VALUES = {"--save": "save", "--from": "from_file", "--deep-timeout": "deep_timeout"}
REPEATED = {"--matrix": "matrix", "--error": "errors", "--error-file": "error_files"}


def parse(argv: Sequence[str]) -> dict[str, Any] | None:
    """The doctor options in ``argv`` (after the word ``doctor``), or None if not plain."""
    opts: dict[str, Any] = {"json_out": False, "strict": False, "deep": False, "save": None,
                            "from_file": None, "matrix": [], "timings": False,
                            "deep_timeout": None, "errors": [], "error_files": []}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in FLAGS and not eq:
            opts[FLAGS[name]] = True
        elif name in VALUES or name in REPEATED:
            if not eq:
                if not args or args[0].startswith("-"):
                    return None  # typer says what is missing
                value = args.pop(0)
            if not value:
                return None
            if name == "--deep-timeout":
                opts["deep_timeout"] = value  # checked by the library (UsageError)
            elif name in VALUES:
                opts[VALUES[name]] = Path(value)
            else:  # an error message stays text; files are paths
                opts[REPEATED[name]].append(value if name == "--error" else Path(value))
        else:
            return None
    return opts


def run(argv: Sequence[str]) -> int | None:
    """Run ``dnnctl doctor ARGV``; the exit status, or None when typer must handle it."""
    opts = parse(argv)
    if opts is None:
        return None
    from dnnctl.doctor import native, spawn, timing

    if opts["from_file"] is None:  # the NVML child and ldconfig run while doctor imports
        spawn.prestart(native.nvml_argv())
        ldconfig = spawn.which("ldconfig", os.environ) or next(
            (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
        if ldconfig:
            spawn.prestart([ldconfig, "-p"])
    if opts["timings"]:
        timing.enable()
    if timing.enabled():
        timing.record("start-up: exec to doctor (interpreter, imports)", timing.process_ms()
                      or 0.0)
    with timing.span("start-up: import api, errors"):
        from dnnctl import api

    def renderer() -> None:  # rich and the renderer load while the probes run
        import dnnctl.cli.doctor_render  # noqa: F401
        import dnnctl.cli.render  # noqa: F401

    try:
        report = api.doctor(from_file=opts["from_file"], deep=opts["deep"],
                            matrix=opts["matrix"], save=opts["save"],
                            deep_timeout=opts["deep_timeout"], while_probing=renderer,
                            errors=opts["errors"], error_files=opts["error_files"])
    except (Exception, KeyboardInterrupt) as exc:  # rendered as the typer path does
        from dnnctl.cli.render import error_status

        return error_status(exc, as_json=opts["json_out"])
    from dnnctl.cli.doctor_render import exit_code, render, show_timings
    from dnnctl.cli.render import print_json

    if opts["json_out"]:
        print_json(report.to_dict())
    else:
        with timing.span("render (rich)"):
            render(report, saved=opts["save"])
    show_timings()
    return int(exit_code(report.verdict, opts["strict"]))
