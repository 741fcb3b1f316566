"""Rendering of ``dnnctl workload from-onnx``: what the import mapped, fused and left out."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from dnnctl.cli.render import console


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
