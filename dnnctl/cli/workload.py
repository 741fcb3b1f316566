"""``dnnctl workload``: make workload files (the problems a model runs) from models.

Exit status: 0 a workload was written; 1 the model has no node dnnctl implements; 2 bad
usage, an unreadable model or an unbound symbolic dimension.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from dnnctl.cli.options import JsonOpt
from dnnctl.cli.render import console, print_json
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
    if json_out:
        ctx.find_root().meta["dnnctl.json"] = True
    from dnnctl import api

    out = output if output is not None else model.with_name(model.stem + ".workload.yaml")
    info = api.workload_from_onnx(model, out, batch=batch, dtype=dtype, dims=dim,
                                  layout=layout.upper())
    if json_out:
        print_json(info)
    else:
        render(info)
    raise typer.Exit(int(ExitCode.OK if info["output"] else ExitCode.FAIL))


def render(info: dict[str, Any]) -> None:
    """The summary: problems per op, fusions, and the nodes left out (80 columns)."""
    by_op: dict[str, list[int]] = {}
    for it in info["items"]:
        n = by_op.setdefault(it["op"], [0, 0])
        n[0] += 1
        n[1] += it["count"]
    console.print(f"{escape(info['model'])}: {info['nodes']} nodes -> {info['problems']} "
                  f"problems ({info['calls']} calls per step)")
    if info["dims"]:
        console.print("  dims: " + escape(", ".join(f"{k}={v}" for k, v in
                                                    info["dims"].items())))
    for op, (problems, calls) in sorted(by_op.items()):
        console.print(f"  {op:<18} {problems:>4} problems {calls:>6} calls")
    for label, key in (("fused into a problem", "fused"), ("views (no kernel)", "views"),
                       ("not implemented", "unimplemented")):
        if info[key]:
            console.print(f"  {label}:")
            for what, n in sorted(info[key].items(), key=lambda kv: -kv[1]):
                console.print(f"    {escape(what):<34} {n:>4}")
    for op, why in info["skipped"].items():
        console.print(f"  [dim]{escape(op)}: {escape(why)}[/]", overflow="fold")
    if info["attention_patterns"]:
        console.print(f"  attention: {info['attention_patterns']} pattern(s), tuned as "
                      "batched matmul + softmax + matmul")
    if info["output"]:
        console.print(f"[green]✓[/] wrote {escape(info['output'])}; next:")
        console.print(f"  dnnctl tune {escape(info['output'])}")
    else:
        console.print("[yellow]no node of this model maps to a dnnctl op; nothing written[/]")
