"""Options shared by several commands, as Annotated aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DeviceOpt = Annotated[
    str | None,
    typer.Option("--device", "-d", help="cuda:N, cpu, or auto (the GPU if present, else cpu)."),
]
PlanPathArg = Annotated[Path, typer.Argument(help="A dnnctl-plan/1 YAML file.")]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="File to write.")]
