"""The public ``dnnctl.ops.attention`` / ``attention_backward`` calls.

One parse function turns the user's arguments into (key, input names, arrays, attrs); the
call goes through the run-time pipeline (``dnnctl.ops.dispatch.call``: signature cache,
plan lookup, default heuristic, kernel cache, outputs in the caller's kind), with no
private fast path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _call_checks as mc
from dnnctl.ops import dispatch
from dnnctl.ops.attention.op import ATTN_DTYPES, CAUSAL, LAYOUTS, lse_shape, qkv_shapes
from dnnctl.ops.base import dtype_name
from dnnctl.ops.dispatch import CallSpec, PlanLike, call, spec_outputs

_CAUSAL_ALIASES = {False: "none", None: "none", True: "top_left", "none": "none",
                   "top_left": "top_left", "bottom_right": "bottom_right"}


@dataclass
class Parsed:
    """An attention call as the dispatcher takes it."""

    key: dict[str, Any]
    names: tuple[str, ...]
    arrays: list[Any]
    attrs: dict[str, Any]


def _shape(x: Any, name: str, ndim: int) -> tuple[int, ...]:
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != ndim:
        raise ShapeError(f"attention: {name} has shape {shape}, expected {ndim} dimensions",
                         hint="BHSD: (batch, heads, seq, dim); BSHD: (batch, seq, heads, dim); "
                              "varlen: (tokens, heads, dim); paged k/v: (pages, page, heads, "
                              "dim)")
    return shape


def parse(q: Any, k: Any, v: Any, *, causal: Any = False, scale: float | None = None,
          window: int | None = None, softcap: float | None = None, layout: str = "BHSD",
          cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, block_table: Any = None,
          seqused_k: Any = None, backward: Sequence[Any] | None = None) -> Parsed:
    """(key, inputs, attrs) of an attention call; ``backward`` = (out, dout, lse)."""
    try:
        mask = _CAUSAL_ALIASES[causal]
    except (KeyError, TypeError):
        raise UsageError(f"attention: causal={causal!r} is not understood",
                         hint=f"use False / True (top_left) or one of {list(CAUSAL)}") from None
    if layout not in LAYOUTS:
        raise UsageError(f"attention: layout={layout!r}", hint=f"use one of {list(LAYOUTS)}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    paged = block_table is not None or seqused_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise UsageError("attention: varlen needs both cu_seqlens_q and cu_seqlens_k")
    if paged and (block_table is None or seqused_k is None):
        raise UsageError("attention: a paged KV cache needs block_table and seqused_k")
    dtype = dtype_name(q.dtype)
    if dtype not in ATTN_DTYPES:
        raise ShapeError(f"attention: q has dtype {dtype}", hint="use float16 or bfloat16")
    for name, x in (("k", k), ("v", v), *zip(("out", "dout"), (backward or ())[:2])):
        if dtype_name(x.dtype) != dtype:
            raise ShapeError(f"attention: {name} has dtype {dtype_name(x.dtype)}, expected "
                             f"{dtype} (the dtype of q)", hint="cast q, k, v to one dtype")
    if window is not None and (type(window) is bool or not isinstance(window, Integral)
                               or window < 0):
        raise UsageError(f"attention: window={window!r} must be an int >= 0 (keys a query "
                         "may look back; 0 or None = no window)")
    for name, value in (("scale", scale), ("softcap", softcap)):
        if value is not None:
            mc.as_float(value, name)
    key: dict[str, Any] = {"dtype": dtype, "causal": mask, "window": int(window or 0),
                           "softcap": float(softcap or 0.0), "varlen": varlen}
    if varlen:
        tq, hq, d = _shape(q, "q", 3)
        tk, hkv, dk = _shape(k, "k", 3)
        dv = _shape(v, "v", 3)[2]
        key.update(batch=int(cu_seqlens_q.shape[0]) - 1, seq_q=tq, seq_kv=tk, layout="BSHD")
        if int(cu_seqlens_k.shape[0]) != key["batch"] + 1:
            raise ShapeError("attention: cu_seqlens_q and cu_seqlens_k differ in length")
    else:
        b, s1, s2, d = _shape(q, "q", 4)
        hq, sq = (s1, s2) if layout == "BHSD" else (s2, s1)
        kshape = _shape(k, "k", 4)
        if paged:
            pages, page, hkv, dk = kshape
            vshape = _shape(v, "v", 4)
            dv = vshape[3]
            if vshape[:3] != (pages, page, hkv):
                raise ShapeError(f"attention: v's page pool {vshape[:3]} differs from k's "
                                 f"{(pages, page, hkv)}", hint="k and v share one page table")
            _check_pages(block_table, seqused_k, b)
            nblk = int(block_table.shape[1])
            key.update(paged=page, seq_kv=nblk * page)
        else:
            hkv, skv = (kshape[1], kshape[2]) if layout == "BHSD" else (kshape[2], kshape[1])
            dk, dv = kshape[3], _shape(v, "v", 4)[3]
            key.update(seq_kv=skv)
        key.update(batch=b, seq_q=sq, layout=layout)
    if dk != d:
        raise ShapeError(f"attention: q head_dim {d} != k head_dim {dk}")
    key.update(heads_q=hq, heads_kv=hkv, head_dim=d, head_dim_v=dv)
    if not hkv or hq % hkv:
        raise ShapeError(f"attention: q has {hq} heads, k / v {hkv}",
                         hint="q's heads must be a multiple of k's (grouped-query attention)")
    names = ["q", "k", "v"]
    arrays = [q, k, v]
    if backward is not None:
        key["pass"] = "backward"
        names += ["out", "dout", "lse"]
        arrays += list(backward)
    _check_shapes(key, dict(zip(names, arrays)), paged)
    if varlen:
        names += ["cu_seqlens_q", "cu_seqlens_k"]
        arrays += [cu_seqlens_q, cu_seqlens_k]
    if paged:
        names += ["block_table", "seqused_k"]
        arrays += [block_table, seqused_k]
    return Parsed(key, tuple(names), arrays, {"scale": None if scale is None else float(scale)})


def _check_shapes(key: dict[str, Any], arrays: dict[str, Any], paged: bool) -> None:
    """Every tensor's shape against the one the key implies: q's batch, k's heads and
    length and v's must agree (a k / v of another batch or head count was read in part)."""
    want = qkv_shapes(dict(key, paged=key.get("paged", 0)))
    want["dout"] = want["out"]
    want["lse"] = lse_shape(key)
    for name, arr in arrays.items():
        if paged and name in ("k", "v"):
            continue  # a page pool (checked against each other and the table)
        if tuple(arr.shape) != tuple(want[name]):
            raise ShapeError(f"attention: {name} has shape {tuple(arr.shape)}, expected "
                             f"{tuple(want[name])}",
                             hint=f"q, k, v share the batch, k and v their heads and length "
                             f"(layout {key['layout']}); out, dout and lse are what the "
                             "forward returned")


def _check_pages(table: Any, used: Any, batch: int) -> None:
    """A paged cache's table (batch, pages per sequence) and lengths (batch,): shapes and
    dtypes (their values are checked where the host reads them: the numpy variants)."""
    if len(table.shape) != 2 or int(table.shape[0]) != batch:
        raise ShapeError(f"attention: block_table has shape {tuple(table.shape)}, expected "
                         f"({batch}, pages per sequence)")
    if tuple(used.shape) != (batch,):
        raise ShapeError(f"attention: seqused_k has shape {tuple(used.shape)}, expected "
                         f"({batch},)")
    for name, a in (("block_table", table), ("seqused_k", used)):
        if dtype_name(a.dtype) != "int32":
            raise ShapeError(f"attention: {name} has dtype {dtype_name(a.dtype)}",
                             hint="pass int32 page indices and lengths")


_FORWARD_OPTIONAL = ("cu_seqlens_q", "cu_seqlens_k", "block_table", "seqused_k")


def _pipeline(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> dispatch.Parsed:
    """The call spec's parse: arrays are (q, k, v, out, dout, lse, cu_seqlens_q,
    cu_seqlens_k, block_table, seqused_k), None where absent."""
    q, k, v, out, dout, lse, cu_q, cu_k, table, used = arrays
    causal, scale, window, softcap, layout, return_lse, backward = scalars
    if backward and lse is not None and dtype_name(lse.dtype) != "float32":
        raise ShapeError(f"attention_backward: lse has dtype {dtype_name(lse.dtype)}, "
                         "expected float32 (as the forward returns it)")
    p = parse(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
              layout=layout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table,
              seqused_k=used, backward=(out, dout, lse) if backward else None)
    index = {"q": 0, "k": 1, "v": 2, "out": 3, "dout": 4, "lse": 5, "cu_seqlens_q": 6,
             "cu_seqlens_k": 7, "block_table": 8, "seqused_k": 9}
    inputs = tuple((n, index[n], None) for n in p.names)
    outputs = spec_outputs("attention", p.key)
    result: Any = ("dq", "dk", "dv") if backward else (("out", "lse") if return_lse else "out")
    if all(a is None or a.flags.c_contiguous for a in arrays):
        return dispatch.Parsed("attention", p.key, inputs, outputs, attrs=p.attrs,
                               result=result)

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        """Kernels read dense row-major storage: copy anything else on every call."""
        return {n: xp.ascontiguousarray(back[i]) for n, i, _ in inputs if back[i] is not None}

    def finish(kouts: dict[str, Any], back: tuple[Any, ...]) -> Any:
        return tuple(kouts[n] for n in result) if isinstance(result, tuple) else kouts[result]

    # inputs too: a strided_io kernel (torch's SDPA) takes the arrays as they are
    return dispatch.Parsed("attention", p.key, inputs, outputs, attrs=p.attrs,
                           result=result, prepare=prepare, finish=finish)


_ATTENTION = CallSpec("attention", _pipeline, ("q", "k", "v"))


def attention(q: Any, k: Any, v: Any, causal: Any = False, scale: float | None = None,
              window: int | None = None, softcap: float | None = None, layout: str = "BHSD",
              cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, return_lse: bool = False,
              plan: PlanLike | None = None, block_table: Any = None,
              seqused_k: Any = None) -> Any:
    """``softmax(q k^T * scale) v`` with fp32 accumulation (see dnnctl.ops.attention.op).

    ``q`` (B, Hq, Sq, D) for layout BHSD or (B, Sq, Hq, D) for BSHD; ``k`` / ``v`` with
    Hkv heads dividing Hq (GQA). ``causal``: False, True (= "top_left", as torch) or
    "bottom_right" (as flash-attn); ``window`` keys back (0 / None: off); ``softcap``
    c * tanh(s / c). Varlen: packed (tokens, heads, dim) arrays with int32 cu_seqlens.
    Paged KV: k / v (pages, page, Hkv, D), int32 block_table (B, pages per sequence) and
    seqused_k (B,). Returns out, or (out, lse) with ``return_lse`` (lse float32 (B, Hq, Sq),
    varlen (Hq, Tq)). The variant is the plan's choice for the shape, else the default.
    """
    return call(_ATTENTION, (q, k, v, None, None, None, cu_seqlens_q, cu_seqlens_k,
                             block_table, seqused_k),
                (causal, scale, window, softcap, layout, bool(return_lse), False), plan)


def attention_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                       causal: Any = False, scale: float | None = None,
                       window: int | None = None, softcap: float | None = None,
                       layout: str = "BHSD", cu_seqlens_q: Any = None,
                       cu_seqlens_k: Any = None, plan: PlanLike | None = None
                       ) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of :func:`attention` given its ``out`` and ``lse`` and the gradient
    ``dout`` of its output; arguments as for the forward call."""
    return call(_ATTENTION, (q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, None, None),
                (causal, scale, window, softcap, layout, False, True), plan)
