"""F.scaled_dot_product_attention -> ``dnnctl.ops.attention``, where this dnnctl has it.

Used by :func:`dnnctl.torch.patch` on traced graphs. A call is routed when it has no
attention mask and no dropout (GQA with ``enable_gqa=True`` included), and the op takes
``(q, k, v, causal=..., scale=...)``; torch's ``is_causal`` is the top-left aligned mask
(``causal=True``). Routed calls run ``torch.ops.dnnctl.attention`` (eager, under
torch.compile through its fake kernel, with autograd); calls dnnctl refuses at run time run
torch's SDPA and are counted.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from dnnctl.errors import DnnctlError
from dnnctl.torch import kernels
from dnnctl.torch.modules import run_op

_NEEDED = ("causal", "scale")


def _signature_ok(fn: Any) -> str | None:
    # dnnctl.ops.attention is also a package, made callable as the function once imported
    fn = getattr(fn, "__dnnctl_call__", fn)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "dnnctl.ops.attention has no inspectable signature"
    missing = [p for p in _NEEDED if p not in params]
    if missing:
        return f"dnnctl.ops.attention takes no {', '.join(missing)} argument"
    return None


def _backward_on_dnnctl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                        scale: float | None, handle: int) -> bool:
    """The attention backward of this call would run on dnnctl (the handle's backward mode
    and plan, see dnnctl.torch.grad_plan); records the forward and backward problems for
    active record() sessions either way."""
    from dnnctl.torch import grad_plan as gp
    from dnnctl.torch import keys
    from dnnctl.torch import own_grads as og

    if kernels.RECORDERS:
        try:
            kernels.note_problem("attention", keys.attention(q, k, v, is_causal, scale))
        except DnnctlError:
            pass
    return "backward" in gp.decide("attention", handle, q,
                                   lambda: og.attention_keys(q, k, v, is_causal, scale))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
          scale: float | None = None, handle: int = 0, enable_gqa: bool = False
          ) -> torch.Tensor:
    """An SDPA call of a patched graph: ``torch.ops.dnnctl.attention`` (dnnctl's kernels,
    its fake kernel under torch.compile, dnnctl's backward when a gradient is taken) where
    dnnctl takes the call; torch's SDPA for calls with fewer key heads and no enable_gqa
    (torch's own answer), and for training calls whose backward would run torch's formula
    anyway (torch's fused forward + backward beat a dnnctl forward plus a recomputed one)."""
    def torch_sdpa() -> torch.Tensor:
        kw = {"enable_gqa": True} if enable_gqa else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, **kw)

    if not enable_gqa and q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        return torch_sdpa()
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad and (torch.compiler.is_compiling()
                 or not _backward_on_dnnctl(q, k, v, bool(is_causal), scale, handle)):
        return torch_sdpa()
    return run_op("attention", q, k, v, bool(is_causal), scale, bool(enable_gqa), handle)[0]


def route_sdpa(gm: fx.GraphModule, nodes: list[fx.Node], report: Any, handle: int = 0) -> None:
    """Replace the SDPA ``nodes`` of ``gm`` that dnnctl can run; report the others."""
    from dnnctl.ops import attention
    from dnnctl.torch.report import Covered, Skipped

    why = _signature_ok(attention)
    for node in nodes:
        kw = dict(node.kwargs)
        args = list(node.args)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        bound = dict(zip(names, args))
        bound.update(kw)
        reason = why
        if reason is None and bound.get("attn_mask") is not None:
            reason = "an attention mask"
        if reason is None and bound.get("dropout_p", 0.0) not in (0, 0.0):
            reason = "dropout"
        if reason is not None:
            report.skipped.append(Skipped(node.name, "scaled_dot_product_attention", reason))
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(
                _sdpa, (bound["query"], bound["key"], bound["value"],
                        bound.get("is_causal", False), bound.get("scale"), handle,
                        bound.get("enable_gqa", False)))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        report.covered.append(Covered(node.name, "scaled_dot_product_attention", "attention",
                                      "eager only"))
    gm.recompile()
