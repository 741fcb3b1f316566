"""Chains of elementwise ops from real models, for the pointwise fusion tests (unit: the
generated code's Python rendering on CPU; GPU: the CUDA kernel). Each case is
(name, module, input shapes, permute of the first input or None, expected groups)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half (models/llama/modeling_llama.py)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rope(nn.Module):
    """transformers' apply_rotary_pos_emb on q and k (b, heads, s, d), tables (s, d) in fp32
    cast to the activations' dtype and unsqueezed, as the LLaMA family does."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = cos.to(q.dtype).unsqueeze(0).unsqueeze(0)
        sin = sin.to(q.dtype).unsqueeze(0).unsqueeze(0)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class T5Norm(nn.Module):
    """T5LayerNorm: variance in fp32, the tail elementwise (transformers' modeling_t5.py)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(self.weight.dtype)


class QuickGelu(nn.Module):
    """CLIP's QuickGELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class SwiGlu(nn.Module):
    """silu(gate) * up from one fused projection's halves (slices of its last dim)."""

    def forward(self, gu: torch.Tensor) -> torch.Tensor:
        h = gu.shape[-1] // 2
        return F.silu(gu[..., :h]) * gu[..., h:]


class LayerScale(nn.Module):
    """DINOv2 / ConvNeXt: residual + gamma * branch, and a GELU (tanh form) before it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(d))

    def forward(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * F.gelu(branch, approximate="tanh")


class ScaleShift(nn.Module):
    """A diffusion UNet's AdaGN tail: h * (1 + scale[:, :, None, None]) + shift, with a
    runtime scalar (a python float from the input's size) and a division."""

    def forward(self, h: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        s = 1.0 / math.sqrt(2.0)
        return (h * (1 + scale[:, :, None, None]) + shift[:, :, None, None]) * s / h.shape[0]


class GeluMix(nn.Module):
    """exp / tanh / relu / abs / sqrt / pow / neg / sub in one chain (casts included)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x) - y.abs().sqrt() + torch.tanh(y) * 0.5
        return (a.float().pow(2) - torch.exp(-x.float())).to(x.dtype) / (2 - F.gelu(y))


CASES = [
    # name, module, input shapes, first input permuted (a transposed view) or None
    ("rope_decode", Rope(), [(2, 4, 1, 16), (2, 4, 1, 16), (1, 16), (1, 16)], None),
    ("rope_prefill_transposed", Rope(), [(2, 6, 4, 16), (2, 6, 4, 16), (4, 16), (4, 16)],
     (0, 2, 1, 3)),
    ("t5_norm", T5Norm(24), [(3, 5, 24)], None),
    ("quick_gelu", QuickGelu(), [(4, 40)], None),
    ("swiglu", SwiGlu(), [(3, 2, 32)], None),
    ("layer_scale", LayerScale(8), [(2, 8), (2, 8)], None),
    ("scale_shift_channels_last", ScaleShift(), [(2, 4, 3, 5), (2, 4), (2, 4)], "cl"),
    ("mix", GeluMix(), [(5, 7), (5, 7)], None),
]


def inputs(shapes: list[tuple[int, ...]], perm: object, dtype: torch.dtype, device: str,
           seed: int = 0) -> list[torch.Tensor]:
    """Fresh random inputs; the first laid out as ``perm`` says (a transposed view of a
    contiguous tensor, or channels_last). Tables (2-D inputs after the first two of a rope)
    stay float32, as models keep them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, s in enumerate(shapes):
        dt = torch.float32 if (len(s) == 2 and i >= 2 and len(shapes) == 4) else dtype
        if i == 0 and isinstance(perm, tuple):
            inv = [perm.index(d) for d in range(len(s))]
            base = torch.randn([s[p] for p in perm], generator=g)
            t = base.permute(*inv)
        else:
            t = torch.randn(s, generator=g)
            if i == 0 and perm == "cl":
                t = t.contiguous(memory_format=torch.channels_last)
        out.append(t.to(dtype=dt, device=device))
    return out
