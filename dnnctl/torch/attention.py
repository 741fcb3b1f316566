"""F.scaled_dot_product_attention -> ``dnnctl.ops.attention``, where this dnnctl has it.

Used by :func:`dnnctl.torch.patch` on traced graphs. A call is routed when it has no
attention mask and no dropout (GQA with ``enable_gqa=True`` included), and the op takes ``(q, k, v, causal=...,
scale=...)``; torch's ``is_causal`` is the top-left aligned mask (``causal=True``). Calls dnnctl refuses at
run time, and calls under torch.compile (there is no torch.library op for attention yet),
run torch's SDPA.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from dnnctl.errors import DnnctlError
from dnnctl.torch import kernels
from dnnctl.torch._tensors import call

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


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
          scale: float | None = None, handle: int = 0, enable_gqa: bool = False
          ) -> torch.Tensor:
    def torch_sdpa() -> torch.Tensor:
        kw = {"enable_gqa": True} if enable_gqa else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, **kw)

    if torch.compiler.is_compiling() or q.requires_grad and torch.is_grad_enabled():
        return torch_sdpa()
    if not enable_gqa and q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        return torch_sdpa()  # fewer key heads without enable_gqa: torch's own answer
    import dnnctl.ops

    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    try:
        out = call(dnnctl.ops.attention, (q, k, v), causal=bool(is_causal), scale=scale,
                   plan=kernels.PLANS.get(handle) if handle else None)
    except DnnctlError as exc:
        kernels.FALLBACKS[("attention", exc.message[:160])] += 1
        return torch_sdpa()
    if kernels.RECORDERS:  # record(): the attention problem the model runs, to tune
        from dnnctl.ops.attention.function import parse

        kernels.note_problem("attention", parse(q, k, v, causal=bool(is_causal),
                                                scale=scale).key)
    return out


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
