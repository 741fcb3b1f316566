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
from torch import fx, nn

from dnnctl.errors import DnnctlError
from dnnctl.ops.attention.function import _ATTENTION
from dnnctl.torch import kernels
from dnnctl.torch.library import direct_ok, run_op
from dnnctl.torch.native import Direct

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


_ATTN_DTYPES = (torch.float16, torch.bfloat16)


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """dnnctl's attention can take these operands at all: 16-bit (B, H, S, D) tensors of
    one dtype (anything else runs torch's fused SDPA, not the op's unfused fallback)."""
    return (q.dtype in _ATTN_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype
            and q.dim() == 4 and k.dim() == 4 and v.dim() == 4)


def needs_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                scale: float | None, handle: int) -> bool:
    """A training call (a gradient wanted) whose attention backward would run torch's
    formula: torch's fused SDPA forward + backward beat a dnnctl forward plus a recomputed
    one. Under torch.compile such calls stay torch's too."""
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                         or v.requires_grad)):
        return False
    return torch.compiler.is_compiling() or not _backward_on_dnnctl(q, k, v, is_causal,
                                                                    scale, handle)


def _backward_on_dnnctl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                        scale: float | None, handle: int) -> bool:
    """The attention backward of this call would run on dnnctl (the handle's backward mode
    and plan, see dnnctl.torch.grad_plan). Active record() sessions get the backward problem
    (from decide) and, where torch's SDPA will run, the forward one (the op records its own
    when it runs), so a recorded training workload tunes both."""
    from dnnctl.torch import grad_plan as gp
    from dnnctl.torch import keys
    from dnnctl.torch import own_grads as og

    with kernels.recording_paused():  # the op's own backward notes it when it runs
        on = "backward" in gp.decide("attention", handle, q,
                                     lambda: og.attention_keys(q, k, v, is_causal, scale),
                                     in_backward=False)
    if not on and kernels.RECORDERS:
        try:
            forward = keys.attention(q, k, v, is_causal, scale)
        except DnnctlError:
            return on
        kernels.note_problem("attention", forward)
        kernels.note_problem("attention", {**forward, "pass": "backward"})
    return on


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

    if not takes(q, k, v) or (not enable_gqa and q.shape[-3] != k.shape[-3]):
        return torch_sdpa()
    if q.is_cuda and direct_ok(q, k, v):  # inference: no gradient wanted
        return _direct_sdpa(q, k, v, bool(is_causal), scale, handle, bool(enable_gqa))
    if needs_torch(q, k, v, bool(is_causal), scale, handle):
        return torch_sdpa()
    return run_op("attention", q, k, v, bool(is_causal), scale, bool(enable_gqa), handle)[0]


# the inference calls of every patched graph's SDPA: straight to the attention site's replay
# Program once the Python path has recorded one (see dnnctl.torch.native.Direct)
_DIRECT = Direct()


def _direct_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                 scale: float | None, handle: int, enable_gqa: bool) -> torch.Tensor:
    key = (handle, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
           q.device, is_causal, scale, enable_gqa)
    # the arrays and scalars kernels.attention gives dnnctl.ops.attention
    arrays = (q, k, v, None, None, None, None, None, None, None)
    got = _DIRECT.run(key, arrays, kernels.plan_of(handle))
    if got is not None:
        return kernels.sdpa_layout(got[0])
    out = run_op("attention", q, k, v, is_causal, scale, enable_gqa, handle)[0]
    _DIRECT.learn(key, _ATTENTION, arrays, (is_causal, scale, None, None, "BHSD", True, False))
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
                                      "torch.ops.dnnctl.attention"))
    gm.recompile()


# ----------------------------------------------------------------------------- nn.MultiheadAttention


def mha_why_not(m: nn.MultiheadAttention) -> str | None:
    """Why a MultiheadAttention module is left to torch (None: dnnctl runs its calls)."""
    if not m._qkv_same_embed_dim:
        return "separate q / k / v projection weights (kdim / vdim)"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv / add_zero_attn"
    if m.head_dim % 8:
        return f"head dim {m.head_dim} is not a multiple of 8"
    return None


def _mha_why(m: nn.MultiheadAttention, need_weights: bool, key_padding_mask: Any,
             attn_mask: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
             ) -> str | None:
    """Why a MultiheadAttention call runs the module's own forward (None: dnnctl takes it)."""
    if need_weights:
        return "need_weights=True (the attention weights are returned)"
    if key_padding_mask is not None or attn_mask is not None:
        return "a mask"
    if not (query is key and key is value):
        return "cross-attention (query, key, value not one tensor)"
    if query.dim() != 3:
        return "unbatched input"
    if query.dtype not in _ATTN_DTYPES:
        return f"{str(query.dtype)[6:]} input (dnnctl attention runs float16 / bfloat16)"
    if m.training and m.dropout > 0:
        return "dropout in training"
    return None


def mha_forward(m: nn.MultiheadAttention, handle: int, query: torch.Tensor,
                key: torch.Tensor, value: torch.Tensor, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    """Self-attention calls (query is key is value) without masks or returned weights, as
    torchvision's ViT makes them: in_proj (dnnctl matmul), attention (the dnnctl op),
    out_proj; every other call (weights wanted, masks, cross-attention, dropout in training,
    unbatched or 32-bit input) runs the module's own forward."""
    def own() -> Any:
        return type(m).forward(m, query, key, value, key_padding_mask=key_padding_mask,
                               need_weights=need_weights, attn_mask=attn_mask,
                               average_attn_weights=average_attn_weights,
                               is_causal=is_causal)

    why = _mha_why(m, need_weights, key_padding_mask, attn_mask, query, key, value)
    if why is not None:
        kernels.FALLBACKS[("multihead_attention", why)] += 1
        return own()
    x = query if m.batch_first else query.transpose(0, 1)
    b, s, e = x.shape
    heads, hd = m.num_heads, m.head_dim
    qkv = run_op("linear", x, m.in_proj_weight, m.in_proj_bias, "none", handle)
    q, k, v = qkv.view(b, s, 3, heads, hd).permute(2, 0, 3, 1, 4)
    if needs_torch(q, k, v, False, None, handle):
        return own()
    o = run_op("attention", q, k, v, False, None, False, handle)[0]
    out = run_op("linear", o.transpose(1, 2).reshape(b, s, e), m.out_proj.weight,
                 m.out_proj.bias, "none", handle)
    return (out if m.batch_first else out.transpose(0, 1)), None
