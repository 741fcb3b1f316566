"""Options shared by several commands, as Annotated aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DeviceOpt = Annotated[
    Optional[str],
    typer.Option("--device", "-d", help="cuda:N, cpu, or auto (the GPU if present, else cpu)."),
]
PlanPathArg = Annotated[Path, typer.Argument(help="A dnnctl-plan/1 YAML file.")]
OutOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="File to write.")]
