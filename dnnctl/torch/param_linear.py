"""Linear layers written as functions of a module's own parameters, in a traced graph.

Not every linear layer is an ``nn.Linear``. GPT-2 and its family (transformers'
``pytorch_utils.Conv1D``: ``torch.addmm(self.bias, x.view(-1, nx), self.weight)`` with the
weight stored (in, out)), CLIP's projections (``x @ self.proj``) and hand-written layers
(``F.linear(x, self.weight, self.bias)``) compute the same product from parameters the
module holds. In the traced graph of an inference model these calls, whose weight (and bias)
are parameters or buffers the graph reads, become one ``dnnctl::linear`` each — the weight
passed as the transposed view the product needs (no copy), read live at every call:

- ``torch.addmm(b, x, W)`` (``beta`` = ``alpha`` = 1) → ``linear(x, W.t(), b)``;
- ``torch.matmul(x, W)`` / ``x @ W`` / ``torch.mm(x, W)`` → ``linear(x, W.t())``;
- ``F.linear(x, W, b)`` → ``linear(x, W, b)``.

A call whose operands do not fit at run time (a 1-D x, a weight that is no longer 2-D, a
bias that is not the output's width) runs the torch function it replaced.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from dnnctl.torch.fuse import add_submodule
from dnnctl.torch.modules import linear_call
from dnnctl.torch.native import Direct
from dnnctl.torch.report import Covered

_MATMULS = {torch.matmul, operator.matmul, torch.mm}


class ParamLinear(nn.Module):
    """One routed call: ``transposed`` (addmm / matmul: W stored (in, out)), the function it
    replaced (run where the operands do not fit)."""

    def __init__(self, fn: Any, transposed: bool, handle: int) -> None:
        super().__init__()
        self.fn, self.transposed, self.handle = fn, transposed, handle
        self._direct = Direct()  # (see fuse.FusedConv)

    def forward(self, x: Any, w: Any, b: Any = None) -> Any:
        if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and w.dim() == 2
                and x.dim() >= 2 and (b is None or isinstance(b, torch.Tensor) and b.dim() == 1)
                and x.shape[-1] == w.shape[0 if self.transposed else 1]
                and (self.fn is not torch.addmm or x.dim() == 2)):
            return self._torch(x, w, b)
        weight = w.t() if self.transposed else w
        if b is not None and b.shape[0] != weight.shape[0]:
            return self._torch(x, w, b)
        return linear_call(self._direct, x, weight, b, "none", self.handle)

    def _torch(self, x: Any, w: Any, b: Any) -> Any:
        if self.fn is torch.addmm:
            return torch.addmm(b, x, w)
        if self.fn is F.linear:
            return F.linear(x, w, b)
        return self.fn(x, w)


def _param(gm: fx.GraphModule, node: Any) -> bool:
    """node reads a parameter or buffer of the model (a get_attr of a tensor)."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return False
    try:
        value = operator.attrgetter(node.target)(gm)
    except AttributeError:
        return False
    return isinstance(value, torch.Tensor)


def _match(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, bool, tuple] | None:
    """(torch function, transposed, (x, w, b) nodes) for a call this pass routes."""
    if node.op != "call_function":
        return None
    fn, args, kw = node.target, node.args, node.kwargs
    if fn is torch.addmm and len(args) == 3 and not kw:
        b, x, w = args
        if _param(gm, b) and _param(gm, w):
            return fn, True, (x, w, b)
    elif fn in _MATMULS and len(args) == 2 and not kw:
        x, w = args
        if _param(gm, w) and not _param(gm, x):
            return fn, True, (x, w, None)
    elif fn is F.linear and not (set(kw) - {"bias"}) and 2 <= len(args) + len(kw) <= 3:
        x, w = args[0], args[1] if len(args) > 1 else None
        b = args[2] if len(args) > 2 else kw.get("bias")
        if _param(gm, w) and (b is None or _param(gm, b)):
            return fn, False, (x, w, b)
    return None


def route_param_linears(gm: fx.GraphModule, report: Any, handle: int) -> int:
    """Replace gm's linear calls on the model's own parameters (see the module's docstring)
    with :class:`ParamLinear` submodules; returns how many."""
    graph, done = gm.graph, 0
    for node in list(graph.nodes):
        got = _match(gm, node)
        if got is None:
            continue
        fn, transposed, (x, w, b) = got
        name = add_submodule(gm, f"linear_{node.name}", ParamLinear(fn, transposed, handle))
        with graph.inserting_before(node):
            new = graph.call_module(name, (x, w) if b is None else (x, w, b))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        what = getattr(fn, "__name__", str(fn))
        report.covered.append(Covered(node.name, what, "matmul",
                                      f"{what} of the parameter {w.target}"))
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done
