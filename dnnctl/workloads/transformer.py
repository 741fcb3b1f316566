"""Transformer workloads built from the real architectures (forward / prefill).

Attention is the fused ``attention`` op (ViT: bidirectional; LLaMA: causal) where the dtype
is fp16 / bf16 and ``attention="fused"``; otherwise (BERT, float32, or ``"unfused"``) the
unfused form: Q·Kᵀ as a batched matmul (one batch per (sequence, head)), a row softmax over
the keys, then P·V. Dropout and rotary embeddings are elementwise work outside dnnctl's ops
and are left out.
"""

from __future__ import annotations

from dnnctl.errors import UsageError
from dnnctl.workloads.model import Workload


def _attention(wl: Workload, batch: int, seq: int, heads: int, head_dim: int, dtype: str
               ) -> None:
    wl.add("matmul", {"batch": batch * heads, "m": seq, "n": seq, "k": head_dim,
                      "dtype": dtype, "trans_b": True})
    wl.add("softmax", {"rows": batch * heads * seq, "cols": seq, "dtype": dtype})
    wl.add("matmul", {"batch": batch * heads, "m": seq, "n": head_dim, "k": seq,
                      "dtype": dtype})


def _fused_attention(wl: Workload, batch: int, seq: int, heads: int, head_dim: int,
                     dtype: str, mode: str, causal: str) -> None:
    if mode not in ("fused", "unfused"):
        raise UsageError(f"attention={mode!r}", hint="use 'fused' or 'unfused'")
    if mode == "unfused" or dtype not in ("float16", "bfloat16"):
        _attention(wl, batch, seq, heads, head_dim, dtype)
        return
    wl.add("attention", {"batch": batch, "heads_q": heads, "seq_q": seq, "head_dim": head_dim,
                         "dtype": dtype, "layout": "BSHD", "causal": causal})


def _linear(wl: Workload, m: int, n: int, k: int, dtype: str, *, bias: bool = True,
            act: str = "none", count: int = 1) -> None:
    wl.add("matmul", {"m": m, "n": n, "k": k, "dtype": dtype, "bias": bias,
                      "activation": act}, count)


def bert_base(batch: int = 8, seq: int = 128, dtype: str = "float16") -> Workload:
    """BERT-base encoder: 12 layers, hidden 768, 12 heads, FFN 3072, GELU, post-LN."""
    wl = Workload("bert_base")
    hidden, heads, ffn, layers = 768, 12, 3072, 12
    m = batch * seq
    wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})  # embeddings
    for _ in range(layers):
        _linear(wl, m, hidden, hidden, dtype, count=3)  # query, key, value
        _attention(wl, batch, seq, heads, hidden // heads, dtype)
        _linear(wl, m, hidden, hidden, dtype)  # attention output
        wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
        _linear(wl, m, ffn, hidden, dtype, act="gelu")
        _linear(wl, m, hidden, ffn, dtype)
        wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, batch, hidden, hidden, dtype)  # pooler dense, then tanh
    wl.add("activation", {"fn": "tanh", "shape": [batch, hidden], "dtype": dtype})
    return wl


def vit_b16(batch: int = 8, dtype: str = "float16", image: int = 224, layout: str = "NHWC",
            classes: int = 1000, attention: str = "fused") -> Workload:
    """ViT-B/16: 16x16 patch embedding conv, 12 pre-LN layers, hidden 768, MLP 3072."""
    wl = Workload("vit_b16")
    hidden, heads, mlp, layers, patch = 768, 12, 3072, 12, 16
    tokens = (image // patch) ** 2 + 1  # patches + [CLS]
    m = batch * tokens
    wl.add("conv2d", {"n": batch, "c": 3, "h": image, "w": image, "k": hidden, "r": patch,
                      "s": patch, "stride": patch, "dtype": dtype, "layout": layout,
                      "bias": True})
    for _ in range(layers):
        wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
        _linear(wl, m, 3 * hidden, hidden, dtype)  # fused qkv
        _fused_attention(wl, batch, tokens, heads, hidden // heads, dtype, attention, "none")
        _linear(wl, m, hidden, hidden, dtype)  # proj
        wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
        _linear(wl, m, mlp, hidden, dtype, act="gelu")
        _linear(wl, m, hidden, mlp, dtype)
    wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, batch, classes, hidden, dtype)  # classification head on [CLS]
    return wl


def llama7b_layer(batch: int = 1, seq: int = 512, dtype: str = "float16",
                  attention: str = "fused") -> Workload:
    """One LLaMA-7B decoder layer, prefill of ``seq`` tokens: RMSNorm, 32 heads of 128,
    SwiGLU MLP 11008 (SiLU fused into the gate projection), no biases."""
    wl = Workload("llama7b_layer")
    hidden, heads, ffn = 4096, 32, 11008
    m = batch * seq
    wl.add("rms_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, m, hidden, hidden, dtype, bias=False, count=3)  # q, k, v
    _fused_attention(wl, batch, seq, heads, hidden // heads, dtype, attention, "top_left")
    _linear(wl, m, hidden, hidden, dtype, bias=False)  # o
    wl.add("rms_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, m, ffn, hidden, dtype, bias=False, act="silu")  # gate
    _linear(wl, m, ffn, hidden, dtype, bias=False)  # up
    _linear(wl, m, hidden, ffn, dtype, bias=False)  # down
    return wl
