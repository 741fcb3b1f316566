"""The end-to-end benchmark models in plain torch, random weights, no downloads.

* ResNet-50 (torchvision's v1.5 layout: stride on the 3x3 conv), eval, fp16 channels_last.
* ViT-B/16 (224x224, patch 16, 12 blocks of 12 heads x 64, MLP 3072 GELU), fp16.
* A LLaMA-7B decoder layer (dim 4096, 32 heads x 128 with rotary embeddings, no GQA,
  RMSNorm, SwiGLU MLP 11008), bf16: prefill of a sequence (causal attention) and one decode
  step against a KV cache (the cache is a buffer the step writes its new key / value into).

Attention uses ``F.scaled_dot_product_attention``, as real models do.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- ResNet-50


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    """``base``: the first stage's width (64); a smaller one keeps the layers and their
    order with every width scaled (host-path benchmarks on the CPU)."""

    def __init__(self, classes: int = 1000, base: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], base
        for width, blocks, stride in ((base, 3, 1), (2 * base, 4, 2), (4 * base, 6, 2),
                                      (8 * base, 3, 2)):
            stage = []
            for i in range(blocks):
                stage.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32 * base, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _randomize_bn(model: nn.Module) -> None:
    """Non-trivial BatchNorm statistics (as a trained model has), so folding is exercised."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.5)
                m.bias.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)


# ----------------------------------------------------------------------------- ViT-B/16


class ViTBlock(nn.Module):
    def __init__(self, dim: int = 768, heads: int = 12, mlp: int = 3072):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class ViTB16(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, dim: int = 768, depth: int = 12,
                 classes: int = 1000):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# ----------------------------------------------------------------------------- LLaMA layer


def rotary_tables(positions: int, head_dim: int, base: float = 10000.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(positions, dtype=torch.float32)[:, None] * inv[None]
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


class LlamaLayer(nn.Module):
    """One LLaMA-7B decoder layer; ``forward(x, start)`` for tokens at positions start...;
    with a KV cache (``cache_len`` > 0) the new keys / values are written at ``start``."""

    def __init__(self, dim: int = 4096, heads: int = 32, hidden: int = 11008,
                 max_pos: int = 4096, cache_batch: int = 0, cache_len: int = 0):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.input_layernorm = nn.RMSNorm(dim, eps=1e-6)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=1e-6)
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act = nn.SiLU()
        cos, sin = rotary_tables(max_pos, self.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.cache_len = cache_len
        if cache_len:
            shape = (cache_batch, heads, cache_len + 1, self.head_dim)
            self.register_buffer("k_cache", torch.randn(shape) * 0.5, persistent=False)
            self.register_buffer("v_cache", torch.randn(shape) * 0.5, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        start = self.cache_len
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        # decode steps one token (the cache's last slot), prefill starts at position 0
        n = 1 if self.cache_len else s  # torch.narrow: traceable with a symbolic length
        cos = torch.narrow(self.cos, 0, start, n).to(x.dtype)
        sin = torch.narrow(self.sin, 0, start, n).to(x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.cache_len:  # decode: write the new key / value, attend over the whole cache
            self.k_cache[:, :, start:] = k
            self.v_cache[:, :, start:] = v
            a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(self.act(self.gate_proj(h)) * self.up_proj(h))


# ----------------------------------------------------------------------------- configs


def _init_linear(model: nn.Module) -> None:
    """Weights scaled so activations stay O(1) through the layers (as in trained models)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=1.0 / math.sqrt(m.in_features))


CONFIGS: dict[str, dict[str, Any]] = {
    "resnet50-b1": {"model": "resnet50", "batch": 1},
    "resnet50-b32": {"model": "resnet50", "batch": 32},
    "resnet50-b256": {"model": "resnet50", "batch": 256},
    "vit_b16-b32": {"model": "vit_b16", "batch": 32},
    "llama7b-prefill2048": {"model": "llama_prefill", "batch": 1, "seq": 2048},
    "llama7b-decode-b8-kv2048": {"model": "llama_decode", "batch": 8, "kv": 2048},
}


def build(name: str, device: str = "cuda") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model in eval on ``device`` in its benchmark dtype / format, example inputs)."""
    cfg = CONFIGS[name]
    torch.manual_seed(0)
    kind, b = cfg["model"], cfg["batch"]
    if kind == "resnet50":
        model = ResNet50()
        _randomize_bn(model)
        model = model.eval().to(device, torch.float16).to(memory_format=torch.channels_last)
        x = torch.randn(b, 3, 224, 224, device=device, dtype=torch.float16)
        return model, (x.contiguous(memory_format=torch.channels_last),)
    if kind == "vit_b16":
        model = ViTB16()
        _init_linear(model)
        model = model.eval().to(device, torch.float16)
        return model, (torch.randn(b, 3, 224, 224, device=device, dtype=torch.float16),)
    if kind == "llama_prefill":
        model = LlamaLayer()
        _init_linear(model)
        model = model.eval().to(device, torch.bfloat16)
        return model, (torch.randn(b, cfg["seq"], 4096, device=device, dtype=torch.bfloat16),)
    model = LlamaLayer(cache_batch=b, cache_len=cfg["kv"])
    _init_linear(model)
    model = model.eval().to(device, torch.bfloat16)
    return model, (torch.randn(b, 1, 4096, device=device, dtype=torch.bfloat16),)
