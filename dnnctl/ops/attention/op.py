"""The attention op: key schema, float64 reference (forward + log-sum-exp, backward), counts
and the default heuristic.

``out = softmax(mask(cap(scale * q k^T))) v`` per (sequence, query head), with query head h
reading key/value head ``h // (heads_q // heads_kv)`` (GQA / MQA).

Tensors (the *stored* layouts; ``D`` = head_dim, ``Dv`` = head_dim_v):

* layout BHSD: q (B, Hq, Sq, D), k (B, Hkv, Skv, D), v (B, Hkv, Skv, Dv), out (B, Hq, Sq, Dv)
* layout BSHD: q (B, Sq, Hq, D), k (B, Skv, Hkv, D), v (B, Skv, Hkv, Dv), out (B, Sq, Hq, Dv)
* varlen (packed, BSHD only): seq_q / seq_kv are the *total* token counts of ``batch``
  sequences; q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), out (Tq, Hq, Dv), with int32
  cu_seqlens_q / cu_seqlens_k (B + 1) giving each sequence's rows.
* paged = page size P > 0 (a decode KV cache): k (N, P, Hkv, D), v (N, P, Hkv, Dv), a pool
  of any N pages (a tuned problem is made with N = B * ceil(Skv / P); the kernels do not
  depend on N), block_table (B, ceil(Skv / P)) int32 naming each sequence's pages in order,
  seqused_k (B,) int32 in [1, Skv]: the sequence's cached length. The numpy variants
  range-check tables and lengths; CUDA kernels do not read them back (no sync).
* lse (B, Hq, Sq) float32, natural log of the softmax denominators (varlen: (Hq, Tq));
  a row with no allowed key has out = 0 and lse = -inf.

Masks, per sequence with Lq queries and Lk keys; query i sits at key position
``i + off`` with off = Lk - Lq (bottom_right and none) or 0 (top_left): causal allows keys
j <= i + off; window w > 0 also requires j >= i + off - w (and j <= i + off + w when not
causal). softcap c > 0 replaces a score s by c * tanh(s / c) (after the scale).

Backward (``pass: backward``): inputs q, k, v, out, dout, lse (as the forward wrote them);
outputs dq, dk, dv in the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import Choice, Field, Op, Problem, TensorSpec, first_choice, np_dtype, pass_of
from dnnctl.ops.registry import register_op, variants

CAUSAL: tuple[str, ...] = ("none", "top_left", "bottom_right")
LAYOUTS: tuple[str, ...] = ("BHSD", "BSHD")
ATTN_DTYPES: tuple[str, ...] = ("float16", "bfloat16")


def kv_pages(problem: Problem) -> int:
    """Pages per sequence of a paged cache (0 when not paged)."""
    page = problem["paged"]
    return -(-problem["seq_kv"] // page) if page else 0


def qkv_shapes(p: Problem) -> dict[str, tuple[int, ...]]:
    """Stored shapes of q, k, v and out."""
    b, hq, hkv, sq, skv = p["batch"], p["heads_q"], p["heads_kv"], p["seq_q"], p["seq_kv"]
    d, dv = p["head_dim"], p["head_dim_v"]
    if p["varlen"]:
        return {"q": (sq, hq, d), "k": (skv, hkv, d), "v": (skv, hkv, dv), "out": (sq, hq, dv)}
    if p["layout"] == "BHSD":
        q, o = (b, hq, sq, d), (b, hq, sq, dv)
    else:
        q, o = (b, sq, hq, d), (b, sq, hq, dv)
    if p["paged"]:
        n = b * kv_pages(p)
        return {"q": q, "k": (n, p["paged"], hkv, d), "v": (n, p["paged"], hkv, dv), "out": o}
    if p["layout"] == "BHSD":
        return {"q": q, "k": (b, hkv, skv, d), "v": (b, hkv, skv, dv), "out": o}
    return {"q": q, "k": (b, skv, hkv, d), "v": (b, skv, hkv, dv), "out": o}


def lse_shape(p: Problem) -> tuple[int, ...]:
    return (p["heads_q"], p["seq_q"]) if p["varlen"] else (p["batch"], p["heads_q"], p["seq_q"])


def mask_offset(problem: Problem, lq: int, lk: int) -> int:
    """Key position of query 0 (see the module docstring)."""
    return 0 if problem["causal"] == "top_left" else lk - lq


def allowed(problem: Problem, lq: int, lk: int) -> np.ndarray:
    """(lq, lk) boolean mask of the keys each query may attend to."""
    off = mask_offset(problem, lq, lk)
    i = np.arange(lq)[:, None] + off
    j = np.arange(lk)[None, :]
    ok = np.ones((lq, lk), dtype=bool)
    causal, w = problem["causal"] != "none", problem["window"]
    if causal:
        ok &= j <= i
    if w:
        ok &= j >= i - w
        if not causal:
            ok &= j <= i + w
    return ok


def scores(problem: Problem, q: np.ndarray, k: np.ndarray, scale: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """Masked, capped scores (H, lq, lk) of one sequence (q (H, lq, D), k (H, lk, D)) and the
    derivative of the cap (1 where no softcap)."""
    s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
    cap = problem["softcap"]
    dcap = np.ones_like(s)
    if cap:
        t = np.tanh(s / cap)
        s, dcap = cap * t, 1.0 - t * t
    ok = allowed(problem, q.shape[-2], k.shape[-2])
    return np.where(ok, s, -np.inf), dcap


def softmax_lse(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row softmax and log-sum-exp of masked scores; empty rows give p = 0, lse = -inf."""
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    den = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
        lse = np.where(den[..., 0] > 0, np.log(np.where(den[..., 0] > 0, den[..., 0], 1.0))
                       + m_safe[..., 0], -np.inf)
    return p, lse


def check_pages(pages: np.ndarray, used: int, pool: int, cap: int) -> None:
    """One sequence's page-table row and length, on the host: the pages exist in the pool of
    ``pool`` pages, the length fits the row's ``cap`` keys (a clear error, not an index
    error or a silent read past the pool)."""
    if pages.size and (int(pages.min()) < 0 or int(pages.max()) >= pool):
        bad = int(pages.min()) if int(pages.min()) < 0 else int(pages.max())
        raise ShapeError(f"attention: block_table names page {bad}; the pool (k, v) has "
                         f"pages 0 .. {pool - 1}")
    if not 1 <= used <= cap:
        raise ShapeError(f"attention: seqused_k holds length {used}; each must be in 1 .. "
                         f"{cap} (the table's pages x page size)")


class Sequence:
    """One sequence's views: q (Hq, lq, D); k, v (Hkv, lk, .); and where its rows go."""

    def __init__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: Any,
                 kv_rows: Any = None) -> None:
        self.q, self.k, self.v, self.rows = q, k, v, rows
        self.kv_rows = rows if kv_rows is None else kv_rows


def sequences(p: Problem, ins: Mapping[str, np.ndarray]) -> Iterator[Sequence]:
    """Each sequence of a call as (head, seq, dim) views; ``rows`` indexes out / lse."""
    q, k, v = ins["q"], ins["k"], ins["v"]
    if p["varlen"]:
        cq = np.asarray(ins["cu_seqlens_q"]).astype(np.int64)
        ck = np.asarray(ins["cu_seqlens_k"]).astype(np.int64)
        for b in range(p["batch"]):
            sq_, sk_ = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            yield Sequence(q[sq_].swapaxes(0, 1), k[sk_].swapaxes(0, 1), v[sk_].swapaxes(0, 1),
                           sq_, sk_)
        return
    bhsd = p["layout"] == "BHSD"
    for b in range(p["batch"]):
        qb = q[b] if bhsd else q[b].swapaxes(0, 1)
        if p["paged"]:
            used = int(np.asarray(ins["seqused_k"])[b])
            pages = np.asarray(ins["block_table"])[b]
            check_pages(pages, used, k.shape[0], p["seq_kv"])
            kb = k[pages].reshape((-1, *k.shape[2:]))[:used].swapaxes(0, 1)
            vb = v[pages].reshape((-1, *v.shape[2:]))[:used].swapaxes(0, 1)
        else:
            kb = k[b] if bhsd else k[b].swapaxes(0, 1)
            vb = v[b] if bhsd else v[b].swapaxes(0, 1)
        yield Sequence(qb, kb, vb, b)


def expand_kv(x: np.ndarray, heads_q: int) -> np.ndarray:
    """(Hkv, L, D) -> (Hq, L, D): each kv head repeated for its group of query heads."""
    return np.repeat(x, heads_q // x.shape[0], axis=0)


def head_view(p: Problem, arr: np.ndarray, rows: Any) -> np.ndarray:
    """The (H, lq, D) view of ``out``-like array ``arr`` for one sequence's rows."""
    if p["varlen"]:
        return arr[rows].swapaxes(0, 1)
    return arr[rows] if p["layout"] == "BHSD" else arr[rows].swapaxes(0, 1)


def lse_view(p: Problem, lse: np.ndarray, rows: Any) -> np.ndarray:
    return lse[:, rows] if p["varlen"] else lse[rows]


@register_op
class Attention(Op):
    """Fused scaled-dot-product attention, forward (with log-sum-exp) and backward."""

    name = "attention"
    doc = ("fused attention softmax(q k^T * scale) v: GQA, causal / window masks, softcap, "
           "varlen, paged KV; forward and backward")
    attrs = {"scale": None}  # None: 1 / sqrt(head_dim)
    fields = {
        "batch": Field("int", minimum=1, doc="sequences"),
        "heads_q": Field("int", minimum=1, doc="query heads"),
        "heads_kv": Field("int", default=0, minimum=0,
                          doc="key/value heads dividing heads_q (GQA); 0 = heads_q"),
        "seq_q": Field("int", minimum=1, doc="queries per sequence (varlen: total)"),
        "seq_kv": Field("int", default=0, minimum=0,
                        doc="keys per sequence (varlen: total; paged: cache capacity); 0 = seq_q"),
        "head_dim": Field("int", minimum=1, doc="q/k head size"),
        "head_dim_v": Field("int", default=0, minimum=0, doc="v/out head size; 0 = head_dim"),
        "dtype": Field("str", choices=ATTN_DTYPES, doc="I/O dtype (fp32 accumulation)"),
        "layout": Field("str", default="BHSD", choices=LAYOUTS),
        "causal": Field("str", default="none", choices=CAUSAL),
        "window": Field("int", default=0, minimum=0, doc="sliding window (keys back); 0 = off"),
        "softcap": Field("float", default=0.0, doc="c * tanh(s / c) on scores; 0 = off"),
        "varlen": Field("bool", default=False, doc="packed sequences with cu_seqlens"),
        "paged": Field("int", default=0, minimum=0, doc="KV cache page size; 0 = contiguous"),
        "pass": Field("str", default="forward", choices=("forward", "backward")),
    }

    def check(self, key: dict[str, Any]) -> None:
        """Fill the 0 = same-as defaults, canonicalize equivalent masks, refuse nonsense."""
        key["heads_kv"] = key["heads_kv"] or key["heads_q"]
        key["seq_kv"] = key["seq_kv"] or key["seq_q"]
        key["head_dim_v"] = key["head_dim_v"] or key["head_dim"]
        if key["heads_q"] % key["heads_kv"]:
            raise UsageError(f"attention: heads_q={key['heads_q']} is not a multiple of "
                             f"heads_kv={key['heads_kv']}", hint="GQA groups must be equal")
        if key["softcap"] < 0:
            raise UsageError("attention key field 'softcap' must be >= 0 (0 = off)")
        if key["varlen"]:
            if key["layout"] != "BSHD":
                raise UsageError("attention: varlen packs tokens as (total, heads, dim)",
                                 hint="use layout BSHD with varlen")
            if key["seq_q"] < key["batch"] or key["seq_kv"] < key["batch"]:
                raise UsageError("attention: varlen seq_q / seq_kv are totals over the batch "
                                 "and must be >= batch")
        if key["paged"] and (key["varlen"] or key["pass"] != "forward"):
            raise UsageError("attention: a paged KV cache is a forward, non-varlen mode",
                             hint="set paged: 0 for varlen or backward")
        if (not key["varlen"] and not key["paged"] and key["causal"] == "bottom_right"
                and key["seq_q"] == key["seq_kv"]):
            key["causal"] = "top_left"  # the same mask

    # -- tensors
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        p, dt = problem, problem["dtype"]
        shapes = qkv_shapes(p)
        specs = {n: TensorSpec(shapes[n], dt) for n in ("q", "k", "v")}
        if pass_of(p) == "backward":
            specs["out"] = TensorSpec(shapes["out"], dt)
            specs["dout"] = TensorSpec(shapes["out"], dt)
            specs["lse"] = TensorSpec(lse_shape(p), "float32")
        if p["varlen"]:
            specs["cu_seqlens_q"] = TensorSpec((p["batch"] + 1,), "int32")
            specs["cu_seqlens_k"] = TensorSpec((p["batch"] + 1,), "int32")
        if p["paged"]:
            specs["block_table"] = TensorSpec((p["batch"], kv_pages(p)), "int32")
            specs["seqused_k"] = TensorSpec((p["batch"],), "int32")
        return specs

    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        p, dt = problem, problem["dtype"]
        shapes = qkv_shapes(p)
        if pass_of(p) == "backward":
            return {"dq": TensorSpec(shapes["q"], dt), "dk": TensorSpec(shapes["k"], dt),
                    "dv": TensorSpec(shapes["v"], dt)}
        return {"out": TensorSpec(shapes["out"], dt), "lse": TensorSpec(lse_shape(p), "float32")}

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Normal q, k, v (scores of std ~1 after the scale); random sequence lengths, page
        tables and cache lengths; for backward, out and lse from the float64 forward."""
        p, dt = problem, np_dtype(problem["dtype"])
        shapes = qkv_shapes(p)
        out = {n: rng.standard_normal(shapes[n], dtype=np.float32).astype(dt)
               for n in ("q", "k", "v")}
        if p["varlen"]:
            out["cu_seqlens_q"] = _cuts(rng, p["seq_q"], p["batch"])
            out["cu_seqlens_k"] = _cuts(rng, p["seq_kv"], p["batch"])
        if p["paged"]:
            n = kv_pages(p)
            out["block_table"] = rng.permutation(p["batch"] * n).astype(np.int32).reshape(
                p["batch"], n)
            used = rng.integers(1, p["seq_kv"] + 1, size=p["batch"]).astype(np.int32)
            used[0] = p["seq_kv"]  # one sequence fills its cache
            out["seqused_k"] = used
        if pass_of(p) == "backward":
            fwd = self.reference(_forward_of(p), {
                k: v.astype(np.float64) if v.dtype != np.int32 else v for k, v in out.items()},
                {})
            out["out"] = fwd["out"].astype(dt)
            out["lse"] = fwd["lse"].astype(np.float32)
            out["dout"] = rng.standard_normal(shapes["out"], dtype=np.float32).astype(dt)
        return out

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """float64 attention of every sequence (forward: out, lse; backward: dq, dk, dv)."""
        p = problem
        scale = attn_scale(p, attrs)
        ins = {k: np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f"
               or str(np.asarray(v).dtype) == "bfloat16" else np.asarray(v)
               for k, v in inputs.items()}
        specs = self.output_specs(p)
        res = {n: np.zeros(s.shape, dtype=np.float64) for n, s in specs.items()}
        if pass_of(p) == "forward":
            res["lse"][...] = -np.inf
        for seq in sequences(p, ins):
            k = expand_kv(seq.k, p["heads_q"])
            v = expand_kv(seq.v, p["heads_q"])
            s, dcap = scores(p, seq.q, k, scale)
            prob, lse = softmax_lse(s)
            if pass_of(p) == "forward":
                head_view(p, res["out"], seq.rows)[...] = np.matmul(prob, v)
                lse_view(p, res["lse"], seq.rows)[...] = lse
                continue
            o = head_view(p, ins["out"], seq.rows)
            do = head_view(p, ins["dout"], seq.rows)
            given = lse_view(p, ins["lse"], seq.rows)[..., None]
            # P from the lse the forward stored (as the kernels do)
            with np.errstate(invalid="ignore"):
                prob = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(given),
                                                                    given, 0.0)), 0.0)
            dv = np.matmul(np.swapaxes(prob, -1, -2), do)
            dp = np.matmul(do, np.swapaxes(v, -1, -2))
            delta = (do * o).sum(axis=-1, keepdims=True)
            ds = prob * (dp - delta) * dcap * scale
            head_view(p, res["dq"], seq.rows)[...] = np.matmul(ds, k)
            dk = np.matmul(np.swapaxes(ds, -1, -2), seq.q)
            g = p["heads_q"] // p["heads_kv"]
            lk = seq.k.shape[1]
            dk = dk.reshape(p["heads_kv"], g, lk, -1).sum(axis=1)
            dv = dv.reshape(p["heads_kv"], g, lk, -1).sum(axis=1)
            _kv_view(p, res["dk"], seq).__setitem__(Ellipsis, dk)
            _kv_view(p, res["dv"], seq).__setitem__(Ellipsis, dv)
        return res

    def tolerance(self, problem: Problem, output: str) -> float:
        """‖out − ref‖/‖ref‖: P is rounded to the I/O dtype before P·V as in every flash
        kernel; lse is fp32 math. Gradients chain three rounded products."""
        if output == "lse":
            return 1e-4
        bwd = pass_of(problem) == "backward"
        if problem["dtype"] == "float16":
            return 1e-2 if bwd else 4e-3
        return 5e-2 if bwd else 2.5e-2

    # -- roofline
    def flops(self, problem: Problem) -> float:
        """4·B·Hq·Sq·Skv·D (2 GEMMs; D averaged over qk / v), halved for causal masks;
        varlen counts the even split; backward is 2.5x (five GEMMs)."""
        p = problem
        pairs = p["batch"] * p["seq_q"] * p["seq_kv"]
        if p["varlen"]:
            pairs = p["seq_q"] * p["seq_kv"] / p["batch"]
        f = 2.0 * p["heads_q"] * pairs * (p["head_dim"] + p["head_dim_v"])
        if p["causal"] != "none":
            f /= 2
        return f * 2.5 if pass_of(p) == "backward" else f

    # -- heuristic
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        """numpy: blocked. CUDA, a small cost rule. Short queries over long caches or a
        paged cache: on sm_90 cuDNN through torch where it takes the problem (measured on the
        H200: 1.12-1.30x decode_ring), then decode_ring; else decode. The rest: on sm_90 cuDNN
        through torch where it takes the problem (1.11-1.5x our Hopper kernel on every prefill
        shape, benchmarks/RESULTS.md), else our Hopper kernel, else the mma.sync kernel, else
        a vendor backend. Backward: our Hopper kernel (wgmma_bwd, dq by fp32
        reductions, like torch's FlashAttention and cuDNN backward), else mma_bwd; under
        deterministic mode only mma_bwd qualifies (registry.variants filters)."""
        table = {v.name: v for v in variants(self.name, backend)}
        p = problem
        if backend == "numpy":
            order = ["blocked", "whole"] if pass_of(p) == "forward" else ["whole"]
        elif pass_of(p) == "backward":
            order = ["wgmma_bwd", "mma_bwd"]
        else:
            decode = p["seq_q"] <= 16 and (p["seq_kv"] >= 256 or p["paged"])
            hopper = getattr(device, "cc_tuple", (0, 0))[0] == 9
            if decode:
                first = (["torch_cudnn"] if hopper else []) + ["decode_ring", "decode"]
            else:
                first = ["torch_cudnn"] if hopper else []
            order = first + ["wgmma", "mma"]
        vendors = [n for n, v in table.items() if getattr(v, "vendor", False)]
        rest = [n for n in table if n not in order and n not in vendors]
        return first_choice(table, order + rest + vendors, p, backend, device)


def attn_scale(problem: Problem, attrs: Mapping[str, Any]) -> float:
    """The score scale: attrs['scale'], else 1 / sqrt(head_dim)."""
    s = attrs.get("scale")
    return float(s) if s is not None else 1.0 / math.sqrt(problem["head_dim"])


LOG2E = 1.4426950408889634  # the CUDA kernels exponentiate with exp2: they take scale * log2(e)


def _cuts(rng: np.random.Generator, total: int, batch: int) -> np.ndarray:
    """cu_seqlens of ``batch`` sequences of >= 1 token summing to ``total``."""
    inner = np.sort(rng.choice(np.arange(1, total), size=batch - 1, replace=False)) \
        if batch > 1 else np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], inner, [total]]).astype(np.int32)


def _forward_of(p: Problem) -> Problem:
    key = dict(p.key)
    key["pass"] = "forward"
    return Problem(p.op, tuple(sorted(key.items())))


def _kv_view(p: Problem, arr: np.ndarray, seq: Sequence) -> np.ndarray:
    """The (Hkv, lk, D) view of a k-shaped array for one sequence (not paged)."""
    if p["varlen"]:
        return arr[seq.kv_rows].swapaxes(0, 1)
    return arr[seq.rows] if p["layout"] == "BHSD" else arr[seq.rows].swapaxes(0, 1)
