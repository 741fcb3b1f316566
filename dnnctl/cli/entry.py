"""The ``dnnctl`` console script: plain `dnnctl doctor` forms run without importing typer
(dnnctl.cli.fast); everything else goes to the typer app (dnnctl.cli.app)."""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point."""
    if len(sys.argv) > 1 and sys.argv[1] == "doctor":
        from dnnctl.cli import fast

        code = fast.run(sys.argv[2:])
        if code is not None:
            sys.stdout.flush()
            raise SystemExit(code)
    from dnnctl.cli.app import main as typer_main

    typer_main()
