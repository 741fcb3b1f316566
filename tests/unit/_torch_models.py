"""Small models for the dnnctl.torch tests: a ResNet bottleneck, a ViT block, a LLaMA block;
the two training cases (:func:`training_case`, :func:`train_step`) the captured-step GPU test
and tools/capture_probe.py run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1x1 -> 3x3 (stride) -> 1x1, BN after each, residual, ReLU."""

    def __init__(self, cin: int = 16, width: int = 8, stride: int = 1):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        self.block1 = Bottleneck(16, 4)
        self.block2 = Bottleneck(16, 8, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class ViTBlock(nn.Module):
    """Pre-norm transformer block: LN -> MHA -> residual, LN -> MLP (GELU) -> residual."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = self.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding over (B, H, S, D), halves rotated."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.arange(s, dtype=torch.float32, device=x.device)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(
        x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LlamaBlock(nn.Module):
    """LLaMA decoder layer: RMSNorm -> attention (rotary, causal SDPA) -> residual,
    RMSNorm -> SwiGLU MLP -> residual."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 88):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = rotary(heads(self.q(h))), rotary(heads(self.k(h))), heads(self.v(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(self.act(self.gate(h)) * self.up(h))


def training_case(case: str) -> tuple:
    """(model, x, y, loss_fn, autocast dtype, make_optimizer) on CUDA, seeded: ``resnet``
    (channels_last, fp16, SGD with momentum) or ``vit`` (two blocks, bf16, capturable AdamW)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if case == "resnet":
        model = SmallResNet().cuda().to(memory_format=torch.channels_last).train()
        x = torch.randn(8, 3, 32, 32, generator=g).cuda().contiguous(
            memory_format=torch.channels_last)
        y = torch.randint(0, 10, (8,), generator=g).cuda()
        return model, x, y, F.cross_entropy, torch.float16, \
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)
    model = nn.Sequential(ViTBlock(), ViTBlock()).cuda().train()
    x = torch.randn(4, 50, 32, generator=g).cuda()
    y = torch.randn(4, 50, 32, generator=g).cuda()
    return model, x, y, F.mse_loss, torch.bfloat16, \
        lambda p: torch.optim.AdamW(p, lr=1e-3, capturable=True)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               loss_fn, amp: torch.dtype, cache: bool = True) -> torch.Tensor:
    """One autocast forward, backward and optimizer step; the loss."""
    with torch.autocast("cuda", dtype=amp, cache_enabled=cache):
        loss = loss_fn(model(x).float(), y)
    loss.backward()
    opt.step()
    return loss


def randomize_bn(model: nn.Module, seed: int = 1,
                 kinds: tuple[type, ...] = (nn.BatchNorm1d, nn.BatchNorm2d)) -> nn.Module:
    """Random BatchNorm statistics and affine parameters (a fold that is not the identity),
    from a generator seeded with ``seed``; returns the model."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, kinds):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model


def randomize_norms(model: nn.Module, seed: int = 1) -> nn.Module:
    """:func:`randomize_bn`, and random affine parameters (weight in [0.5, 1.5), bias in
    [-0.5, 0.5)) for every other normalization module, torch's or a model's own (a class
    whose name ends in ``Norm``: T5's, Qwen2's RMSNorm written by hand); returns the model."""
    randomize_bn(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) or not type(m).__name__.endswith(
                "Norm"):
            continue
        with torch.no_grad():
            for name, p in m.named_parameters(recurse=False):
                shift = 0.5 if name == "weight" else -0.5
                p.copy_(torch.rand(p.shape, generator=g) + shift)
    return model


def bn_stats(model: nn.Module, seed: int = 1) -> nn.Module:
    """``model`` with random running statistics in its BatchNorm2d layers (a folded BN then
    changes the result)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


class Counts(nn.Module):
    """A forward that changes its module's Python state: a call counter, the last batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.last = x.shape[0]
        return self.lin(x) * self.calls
