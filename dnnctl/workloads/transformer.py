"""Transformer workloads built from the real architectures (forward / prefill).

Attention is the unfused form the ops express: Q·Kᵀ as a batched matmul (one batch per
(sequence, head)), a row softmax over the keys, then P·V. Masks, dropout and rotary
embeddings are elementwise work outside dnnctl's ops and are left out.
"""

from __future__ import annotations

from dnnctl.workloads.model import Workload


def _attention(wl: Workload, batch: int, seq: int, heads: int, head_dim: int, dtype: str
               ) -> None:
    wl.add("matmul", {"batch": batch * heads, "m": seq, "n": seq, "k": head_dim,
                      "dtype": dtype, "trans_b": True})
    wl.add("softmax", {"rows": batch * heads * seq, "cols": seq, "dtype": dtype})
    wl.add("matmul", {"batch": batch * heads, "m": seq, "n": head_dim, "k": seq,
                      "dtype": dtype})


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
            classes: int = 1000) -> Workload:
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
        _attention(wl, batch, tokens, heads, hidden // heads, dtype)
        _linear(wl, m, hidden, hidden, dtype)  # proj
        wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
        _linear(wl, m, mlp, hidden, dtype, act="gelu")
        _linear(wl, m, hidden, mlp, dtype)
    wl.add("layer_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, batch, classes, hidden, dtype)  # classification head on [CLS]
    return wl


def llama7b_layer(batch: int = 1, seq: int = 512, dtype: str = "float16") -> Workload:
    """One LLaMA-7B decoder layer, prefill of ``seq`` tokens: RMSNorm, 32 heads of 128,
    SwiGLU MLP 11008 (SiLU fused into the gate projection), no biases."""
    wl = Workload("llama7b_layer")
    hidden, heads, ffn = 4096, 32, 11008
    m = batch * seq
    wl.add("rms_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, m, hidden, hidden, dtype, bias=False, count=3)  # q, k, v
    _attention(wl, batch, seq, heads, hidden // heads, dtype)
    _linear(wl, m, hidden, hidden, dtype, bias=False)  # o
    wl.add("rms_norm", {"rows": m, "cols": hidden, "dtype": dtype})
    _linear(wl, m, ffn, hidden, dtype, bias=False, act="silu")  # gate
    _linear(wl, m, ffn, hidden, dtype, bias=False)  # up
    _linear(wl, m, hidden, ffn, dtype, bias=False)  # down
    return wl
