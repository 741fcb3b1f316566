"""The torch ops' meaning in plain torch: what a call computes when dnnctl cannot run it.

``torch.ops.dnnctl.*`` run dnnctl's kernels for every problem dnnctl supports (float32,
float16 and bfloat16 tensors of a valid key); anything else (float64, as gradcheck uses, or
a shape no kernel takes) is computed here, so an op never fails where torch would not.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ACTS = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
        "relu6": F.relu6, "hardswish": F.hardswish}


def _act(op: str, activation: str) -> Any:
    fn = ACTS.get(activation)
    if fn is None:
        raise ValueError(f"{op}: activation {activation!r} is not one of {sorted(ACTS)}")
    return fn


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple[int, ...],
           padding: tuple[int, ...], dilation: tuple[int, ...], groups: int, activation: str,
           residual: torch.Tensor | None, residual_before_act: bool = False) -> torch.Tensor:
    """residual + act(conv(x, w) + bias), the conv2d epilogue order; with
    ``residual_before_act`` act(conv(x, w) + bias + residual)."""
    if len(padding) == 4:  # (top, bottom, left, right)
        x = F.pad(x, (padding[2], padding[3], padding[0], padding[1]))
        padding = (0, 0)
    act = _act("conv2d", activation)
    y = F.conv2d(x, w, bias, stride, padding, dilation, groups)
    if residual_before_act and residual is not None:
        return act(y + residual)
    y = act(y)
    return y if residual is None else y + residual


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
           activation: str) -> torch.Tensor:
    return _act("linear", activation)(F.linear(x, w, bias))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if weight is not None and tuple(weight.shape) != tuple(x.shape[-1:]):
        raise RuntimeError(f"rms_norm: weight has shape {tuple(weight.shape)}, expected "
                           f"{tuple(x.shape[-1:])} (the normalized last dimension)")
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.to(xf.dtype)).to(x.dtype)


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a training batch_norm's saved batch statistics for x: float32, or
    float64 for a float64 x."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def batch_norm_train(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                     weight: torch.Tensor | None, bias: torch.Tensor | None, momentum: float,
                     eps: float) -> tuple[torch.Tensor, ...]:
    """(y, new_running_mean, new_running_var, save_mean, save_invstd); the batch's
    statistics in float32 (float64 for a float64 x: a double model keeps its precision,
    and second derivatives through them stay exact)."""
    acc = stat_dtype(x)
    if x.dim() >= 2 and x.numel() == x.shape[1]:  # torch's check (the statistics of one
        # value make the running variance NaN)
        raise ValueError("Expected more than 1 value per channel when training, got input "
                         f"size {list(x.shape)}")
    if x.numel() == 0:  # an empty batch (a detection head with no boxes): torch's empty
        # result, the running statistics as they were
        c = x.shape[1] if x.dim() >= 2 else 0
        y = F.batch_norm(x, None, None, weight, bias, True, momentum, eps)
        return (y, running_mean.clone(), running_var.clone(), x.new_zeros(c, dtype=acc),
                x.new_ones(c, dtype=acc))
    rm, rv = running_mean.clone(), running_var.clone()
    y, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
        x, weight, bias, rm, rv, True, momentum, eps)
    return y, rm, rv, save_mean.to(acc), save_invstd.to(acc)


def activation(fn: str, x: torch.Tensor, negative_slope: float = 0.01,
               approximate: str = "none") -> torch.Tensor:
    if fn == "relu":
        return F.relu(x)
    if fn == "leaky_relu":
        return F.leaky_relu(x, negative_slope)
    if fn == "gelu":
        return F.gelu(x, approximate=approximate)
    return {"silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu6": F.relu6,
            "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid}[fn](x)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float | None, enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of SDPA on (B, H, S, D) tensors, in float32 (float64 for float64 inputs):
    torch's top-left causal mask, k / v heads repeated for grouped queries."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = (t.to(acc) for t in (q, k, v))
    if enable_gqa and kf.shape[-3] != qf.shape[-3]:
        rep = qf.shape[-3] // kf.shape[-3]
        kf, vf = kf.repeat_interleave(rep, -3), vf.repeat_interleave(rep, -3)
    s = (qf @ kf.transpose(-1, -2)) * (qf.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ vf
    return out.to(q.dtype), lse


def conv_transpose2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                     stride: tuple[int, ...], padding: tuple[int, ...],
                     output_padding: tuple[int, ...], dilation: tuple[int, ...],
                     groups: int) -> torch.Tensor:
    return F.conv_transpose2d(x, w, bias, stride, padding, output_padding, groups, dilation)
