"""The problems of benchmarks/bench_unseen.py: convolutions and GEMMs of published models
that are NOT in the bundled workloads (ResNet-50, MobileNetV2, BERT-base, the LLaMA-7B layer)
and were never used to set the cost model's constants. No GPU needed (unit-tested).

Convolutions (each in fp16 NHWC and in fp32 NCHW with TF32, bias as a folded norm would give):

* Stable Diffusion v1.5 UNet (Rombach et al., CVPR 2022), 512x512 images = 64x64 latents,
  classifier-free guidance batch 2: 3x3 at 320 @64, 640 @32, 1280 @16 (batch 2-8) and the
  3x3/2 down-sampler 320 @64.
* EfficientNet-B0 (Tan & Le, ICML 2019): MBConv6 depthwise 5x5 240 @28 and 5x5/2 144 @56,
  the 1x1 expansion 40->240 @28 and projection 672->192 @7, batch 32.
* ConvNeXt-T (Liu et al., CVPR 2022): depthwise 7x7 96 @56 and its 1x1 MLP 96->384, batch 32.
* YOLOv8-s (Ultralytics 2023, 640x640): the 3x3/2 down-sampler 64->128 @160 and a C2f 1x1
  128->128 @80, batch 8.
* Whisper (Radford et al., 2022) audio front-end: conv1d 80->768 k3 and 768->768 k3 stride 2
  on 3000 mel frames (run as conv2d with H = 1), batch 8.
* DeepLabv3 (Chen et al., 2017) ASPP: 3x3 dilation 6, 2048->256 @33, batch 4.
* An odd-sized 5x5/2 (an edge shape, no source model): 64->96 @113, batch 16.

GEMMs (x @ W^T with W stored (out, in) as nn.Linear keeps it; bf16 unless noted):

* LLaMA-2-7B (Touvron et al., 2023) prefill at 2048 tokens: fused q/k/v 4096->12288 and
  down 11008->4096; decode GEMV at 1 token: q/k/v 4096->12288.
* Mistral-7B (Jiang et al., 2023) prefill at 4096 tokens: k/v (GQA) 4096->1024, gate/up
  4096->14336; decode at 4 tokens: down 14336->4096.
* Mixtral-8x7B (Jiang et al., 2024) experts at prefill, 4096 tokens x top-2 / 8 experts =
  1024 tokens per expert: a batch of 8 expert up-projections 4096->14336; router
  4096->8 at 8192 tokens; decode at 16 tokens: expert down 14336->4096.
* Large squares 4096^3 and 8192^3 (bf16).
* matmul + bias + GELU against torch's F.linear + F.gelu: BERT-large FFN (Devlin et al.,
  2019) 1024->4096 at 8192 tokens, GPT-2 XL MLP (Radford et al., 2019) 1600->6400 at 2048.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONV_CONFIGS = (("float16", "NHWC"), ("float32", "NCHW"))


@dataclass(frozen=True)
class Case:
    """One benchmark problem: a label, the model it comes from, the op and its key."""

    name: str
    source: str
    op: str
    key: tuple[tuple[str, Any], ...]

    @property
    def key_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.key}

    @property
    def config(self) -> str:
        k = dict(self.key)
        if self.op == "conv2d":
            return f"{k['dtype']} {k['layout']}"
        return str(k["dtype"])


# (name, source, n, c, h, w, k, r, s, stride, pad, dilation, groups)
CONVS: tuple[tuple[Any, ...], ...] = (
    ("sd-unet 3x3 320 @64", "SD v1.5 UNet", 2, 320, 64, 64, 320, 3, 3, 1, 1, 1, 1),
    ("sd-unet 3x3 640 @32", "SD v1.5 UNet", 4, 640, 32, 32, 640, 3, 3, 1, 1, 1, 1),
    ("sd-unet 3x3 1280 @16", "SD v1.5 UNet", 8, 1280, 16, 16, 1280, 3, 3, 1, 1, 1, 1),
    ("sd-unet down 3x3/2 320 @64", "SD v1.5 UNet", 2, 320, 64, 64, 320, 3, 3, 2, 1, 1, 1),
    ("effnet-b0 dw 5x5 240 @28", "EfficientNet-B0", 32, 240, 28, 28, 240, 5, 5, 1, 2, 1, 240),
    ("effnet-b0 dw 5x5/2 144 @56", "EfficientNet-B0", 32, 144, 56, 56, 144, 5, 5, 2, 2, 1,
     144),
    ("effnet-b0 1x1 40->240 @28", "EfficientNet-B0", 32, 40, 28, 28, 240, 1, 1, 1, 0, 1, 1),
    ("effnet-b0 1x1 672->192 @7", "EfficientNet-B0", 32, 672, 7, 7, 192, 1, 1, 1, 0, 1, 1),
    ("convnext-t dw 7x7 96 @56", "ConvNeXt-T", 32, 96, 56, 56, 96, 7, 7, 1, 3, 1, 96),
    ("convnext-t 1x1 96->384 @56", "ConvNeXt-T", 32, 96, 56, 56, 384, 1, 1, 1, 0, 1, 1),
    ("yolov8s 3x3/2 64->128 @160", "YOLOv8-s", 8, 64, 160, 160, 128, 3, 3, 2, 1, 1, 1),
    ("yolov8s c2f 1x1 128->128 @80", "YOLOv8-s", 8, 128, 80, 80, 128, 1, 1, 1, 0, 1, 1),
    ("whisper conv1 80->768 k3", "Whisper", 8, 80, 1, 3000, 768, 1, 3, (1, 1), (0, 1), 1, 1),
    ("whisper conv2 768->768 k3/2", "Whisper", 8, 768, 1, 3000, 768, 1, 3, (1, 2), (0, 1), 1,
     1),
    ("deeplabv3 aspp 3x3 d6 2048->256 @33", "DeepLabv3", 4, 2048, 33, 33, 256, 3, 3, 1, 6, 6,
     1),
    ("odd 5x5/2 64->96 @113", "edge shape", 16, 64, 113, 113, 96, 5, 5, 2, 2, 1, 1),
)
QUICK_CONVS = ("sd-unet 3x3 640 @32", "effnet-b0 dw 5x5 240 @28", "convnext-t dw 7x7 96 @56",
               "yolov8s 3x3/2 64->128 @160", "whisper conv2 768->768 k3/2",
               "deeplabv3 aspp 3x3 d6 2048->256 @33", "odd 5x5/2 64->96 @113")

# (name, source, batch, m, n, k, dtype, bias + gelu)
GEMMS: tuple[tuple[Any, ...], ...] = (
    ("llama2-7b qkv 4096->12288 m=2048", "LLaMA-2-7B", 1, 2048, 12288, 4096, "bfloat16", False),
    ("llama2-7b down 11008->4096 m=2048", "LLaMA-2-7B", 1, 2048, 4096, 11008, "bfloat16",
     False),
    ("llama2-7b qkv 4096->12288 m=1", "LLaMA-2-7B", 1, 1, 12288, 4096, "bfloat16", False),
    ("mistral-7b kv 4096->1024 m=4096", "Mistral-7B", 1, 4096, 1024, 4096, "bfloat16", False),
    ("mistral-7b up 4096->14336 m=4096", "Mistral-7B", 1, 4096, 14336, 4096, "bfloat16", False),
    ("mistral-7b down 14336->4096 m=4", "Mistral-7B", 1, 4, 4096, 14336, "bfloat16", False),
    ("mixtral experts up 8x 4096->14336 m=1024", "Mixtral-8x7B", 8, 1024, 14336, 4096,
     "bfloat16", False),
    ("mixtral router 4096->8 m=8192", "Mixtral-8x7B", 1, 8192, 8, 4096, "bfloat16", False),
    ("mixtral expert down 14336->4096 m=16", "Mixtral-8x7B", 1, 16, 4096, 14336, "bfloat16",
     False),
    ("square 4096^3", "-", 1, 4096, 4096, 4096, "bfloat16", False),
    ("square 8192^3", "-", 1, 8192, 8192, 8192, "bfloat16", False),
    ("bert-large ffn 1024->4096 +bias+gelu m=8192", "BERT-large", 1, 8192, 4096, 1024,
     "float16", True),
    ("gpt2-xl mlp 1600->6400 +bias+gelu m=2048", "GPT-2 XL", 1, 2048, 6400, 1600, "float16",
     True),
)
QUICK_GEMMS = ("llama2-7b qkv 4096->12288 m=2048", "llama2-7b qkv 4096->12288 m=1",
               "mixtral experts up 8x 4096->14336 m=1024", "square 8192^3",
               "bert-large ffn 1024->4096 +bias+gelu m=8192")


def _pair(v: Any) -> tuple[int, int]:
    return tuple(v) if isinstance(v, tuple) else (v, v)  # type: ignore[return-value]


def conv_cases(quick: bool = False) -> list[Case]:
    """Every conv row (both configs), or the quick subset."""
    out = []
    for dtype, layout in CONV_CONFIGS:
        for name, src, n, c, h, w, k, r, s, st, pad, dil, groups in CONVS:
            if quick and name not in QUICK_CONVS:
                continue
            key = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=_pair(st), pad=_pair(pad),
                       dilation=_pair(dil), groups=groups, dtype=dtype, layout=layout,
                       bias=True, tf32=dtype == "float32")
            out.append(Case(name, src, "conv2d", tuple(sorted(key.items()))))
    return out


def gemm_cases(quick: bool = False) -> list[Case]:
    """Every GEMM row, or the quick subset."""
    out = []
    for name, src, batch, m, n, k, dtype, epi in GEMMS:
        if quick and name not in QUICK_GEMMS:
            continue
        key = dict(batch=batch, m=m, n=n, k=k, dtype=dtype, trans_b=True, bias=epi,
                   activation="gelu" if epi else "none")
        out.append(Case(name, src, "matmul", tuple(sorted(key.items()))))
    return out


def cases(quick: bool = False, only: str = "conv,gemm") -> list[Case]:
    """The problems to run, GEMMs first (fewer, and the cheapest to compile)."""
    parts = {p.strip() for p in only.split(",")}
    out = gemm_cases(quick) if "gemm" in parts else []
    return out + (conv_cases(quick) if "conv" in parts else [])
