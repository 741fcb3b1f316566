"""``dnnctl workload``: make workload files (the problems a model runs) from models.

Exit status: 0 a workload was written; 1 the model has no node dnnctl implements; 2 bad
usage, an unreadable model or an unbound symbolic dimension.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dnnctl import api
from dnnctl.cli.options import JsonOpt, json_errors
from dnnctl.cli.render import emit
from dnnctl.cli.workload_render import render
from dnnctl.errors import ExitCode

app = typer.Typer(help="Make dnnctl-workload/1 files from models.", no_args_is_help=True)


@app.command("from-onnx", epilog="Example: dnnctl workload from-onnx model.onnx --batch 8 "
                                 "--dim seq=128 --dtype fp16 -o model.workload.yaml")
def from_onnx(
    ctx: typer.Context,
    model: Annotated[Path, typer.Argument(help="An ONNX model file.")],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Workload file to write (default: MODEL.workload.yaml).")
    ] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", min=1, help="First dimension of every model input.")] = None,
    dim: Annotated[list[str] | None, typer.Option(
        "--dim", metavar="NAME=VALUE", help="Bind a symbolic dimension (repeatable).")
    ] = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="fp16, bf16 or fp32 (default: the model's).")] = None,
    layout: Annotated[str, typer.Option(
        "--layout", help="NCHW (the model's) or NHWC for convs and pools.")] = "NCHW",
    json_out: JsonOpt = False,
) -> None:
    """Turn an ONNX model into a workload: one problem per node dnnctl runs, with counts."""
    json_errors(ctx, json_out)
    out = output if output is not None else model.with_name(model.stem + ".workload.yaml")
    info = api.workload_from_onnx(model, out, batch=batch, dtype=dtype, dims=dim,
                                  layout=layout.upper())
    emit(info, json_out, render)
    raise typer.Exit(int(ExitCode.OK if info["output"] else ExitCode.FAIL))

