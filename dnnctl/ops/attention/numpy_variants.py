"""CPU attention variants (numpy backend), float32 math with one rounding to the I/O dtype.

* ``whole``: the full score matrix of each sequence, softmax, P·V (and the backward).
* ``blocked``: flash-style: query blocks x key blocks with an online softmax (running max,
  running sum, rescaled accumulator), never holding more than one block of scores; key
  blocks entirely outside the mask are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.attention.op import (
    allowed,
    attn_scale,
    expand_kv,
    head_view,
    lse_view,
    sequences,
)
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, Variant, np_dtype
from dnnctl.ops.registry import get_op, register_variant


def _f32(inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v).astype(np.float32) if np.asarray(v).dtype != np.int32
            else np.asarray(v) for k, v in inputs.items()}


def _cap(s: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray | None]:
    if not cap:
        return s, None
    t = np.tanh(s / np.float32(cap))
    return np.float32(cap) * t, 1.0 - t * t


@register_variant
class WholeAttention(Variant):
    """Full scores per sequence (the straightforward CPU form; forward and backward)."""

    op = "attention"
    name = "whole"
    backend = "numpy"
    passes = ("forward", "backward")
    doc = "full score matrix per sequence in float32 (forward and backward)"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        bwd = p["pass"] == "backward"

        specs = {n: (tuple(s.shape), np_dtype(s.dtype))
                 for n, s in get_op("attention").output_specs(p).items()}

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
            scale = np.float32(attn_scale(p, attrs))
            ins = _f32(inputs)
            res = {n: np.zeros(shape, np.float32) for n, (shape, _) in specs.items()}
            if not bwd:
                res["lse"][...] = -np.inf
            for seq in sequences(p, ins):
                k, v = expand_kv(seq.k, p["heads_q"]), expand_kv(seq.v, p["heads_q"])
                s, dcap = _cap(scale * np.matmul(seq.q, np.swapaxes(k, -1, -2)), p["softcap"])
                ok = allowed(p, seq.q.shape[1], k.shape[1])
                s = np.where(ok, s, -np.inf)
                m = s.max(axis=-1, keepdims=True)
                m = np.where(np.isfinite(m), m, 0.0)
                e = np.exp(s - m)
                den = e.sum(axis=-1, keepdims=True)
                if not bwd:
                    safe = np.where(den > 0, den, 1.0)
                    head_view(p, res["out"], seq.rows)[...] = np.matmul(e / safe, v)
                    lse_view(p, res["lse"], seq.rows)[...] = np.where(
                        den[..., 0] > 0, np.log(safe[..., 0]) + m[..., 0], -np.inf)
                    continue
                _backward(p, res, ins, seq, s, dcap, k, v, scale)
            made = {}
            for n, (_, dtype) in specs.items():
                if n in outputs:
                    outputs[n][...] = res[n]
                else:  # adopted: the float32 result rounded once, no copy into ours
                    made[n] = res[n].astype(dtype, copy=False)
            return made

        kernel.adopts = True  # type: ignore[attr-defined]
        return kernel


def _backward(p: Problem, res: dict[str, np.ndarray], ins: dict[str, np.ndarray], seq: Any,
              s: np.ndarray, dcap: np.ndarray | None, k: np.ndarray, v: np.ndarray,
              scale: np.float32) -> None:
    lse = lse_view(p, ins["lse"], seq.rows)[..., None]
    with np.errstate(invalid="ignore"):
        prob = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(lse), lse, 0.0)), 0.0)
    o, do = head_view(p, ins["out"], seq.rows), head_view(p, ins["dout"], seq.rows)
    dp = np.matmul(do, np.swapaxes(v, -1, -2))
    ds = prob * (dp - (do * o).sum(axis=-1, keepdims=True)) * scale
    if dcap is not None:
        ds *= dcap
    head_view(p, res["dq"], seq.rows)[...] = np.matmul(ds, k)
    g, lk = p["heads_q"] // p["heads_kv"], k.shape[1]
    dk = np.matmul(np.swapaxes(ds, -1, -2), seq.q).reshape(p["heads_kv"], g, lk, -1).sum(1)
    dv = np.matmul(np.swapaxes(prob, -1, -2), do).reshape(p["heads_kv"], g, lk, -1).sum(1)
    for name, val in (("dk", dk), ("dv", dv)):
        arr = res[name]
        if p["varlen"]:
            arr[seq.kv_rows] = val.swapaxes(0, 1)
        elif p["layout"] == "BHSD":
            arr[seq.rows] = val
        else:
            arr[seq.rows] = val.swapaxes(0, 1)


@register_variant
class BlockedAttention(Variant):
    """Flash-style online softmax over key blocks (bounded memory per query block)."""

    op = "attention"
    name = "blocked"
    backend = "numpy"
    params = {"block_q": (64, 256), "block_kv": (64, 128, 512)}
    doc = "query x key blocks with an online softmax (flash-style), float32"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        # blocks longer than the sequence are the same as the shortest such block
        return ((params["block_q"] < problem["seq_q"] or params["block_q"] == 64) and
                (params["block_kv"] < problem["seq_kv"] or params["block_kv"] == 64))

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any]:
        return {"block_q": 64, "block_kv": 128}

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        bq, bk = int(params["block_q"]), int(params["block_kv"])

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            scale = np.float32(attn_scale(p, attrs))
            ins = _f32(inputs)
            for seq in sequences(p, ins):
                k, v = expand_kv(seq.k, p["heads_q"]), expand_kv(seq.v, p["heads_q"])
                ok = allowed(p, seq.q.shape[1], k.shape[1])
                out = head_view(p, outputs["out"], seq.rows)
                lse = lse_view(p, outputs["lse"], seq.rows)
                for q0 in range(0, seq.q.shape[1], bq):
                    o, row_lse = _query_block(seq.q[:, q0:q0 + bq], k, v, ok[q0:q0 + bq],
                                              bk, scale, p["softcap"])
                    out[:, q0:q0 + bq] = o.astype(out.dtype)
                    lse[:, q0:q0 + bq] = row_lse

        return kernel


def _query_block(q: np.ndarray, k: np.ndarray, v: np.ndarray, ok: np.ndarray, bk: int,
                 scale: np.float32, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """Online softmax of one query block over the key blocks its mask touches."""
    h, lq = q.shape[0], q.shape[1]
    m = np.full((h, lq, 1), -np.inf, np.float32)
    den = np.zeros((h, lq, 1), np.float32)
    acc = np.zeros((h, lq, v.shape[-1]), np.float32)
    for k0 in range(0, k.shape[1], bk):
        blk = ok[:, k0:k0 + bk]
        if not blk.any():
            continue  # wholly masked: no work (causal / window skipping)
        s, _ = _cap(scale * np.matmul(q, np.swapaxes(k[:, k0:k0 + bk], -1, -2)), cap)
        s = np.where(blk, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        base = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha = np.exp(m - base)  # exp(-inf) = 0 for a row's first allowed block
        e = np.exp(s - base)
        den = den * alpha + e.sum(axis=-1, keepdims=True)
        acc = acc * alpha + np.matmul(e, v[:, k0:k0 + bk])
        m = m_new
    safe = np.where(den > 0, den, 1.0)
    lse = np.where(den[..., 0] > 0, np.log(safe[..., 0]) + np.where(np.isfinite(m[..., 0]),
                                                                    m[..., 0], 0.0), -np.inf)
    return acc / safe, lse.astype(np.float32)
