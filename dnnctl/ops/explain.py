"""Why the default heuristic picks what it picks (the cost model's ranking, per op).

Above the op packages (it imports their cost rankings); :mod:`dnnctl.ops.costmodel` is the
shared machinery below them.
"""

from __future__ import annotations

from typing import Any

from dnnctl.ops.costmodel import Estimate


def ranked_estimates(problem: Any, backend: str, device: Any) -> list[Estimate]:
    """The cost model's estimates for a conv2d (forward) or matmul problem, cheapest first;
    [] for other ops and passes."""
    if problem.op == "conv2d" and problem.get("pass", "forward") == "forward":
        from dnnctl.ops.conv2d.op import ranked
    elif problem.op == "matmul":
        from dnnctl.ops.matmul.op import ranked
    else:
        return []
    return ranked(problem, backend, device)
