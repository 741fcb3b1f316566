#!/usr/bin/env python3
"""Attention on the GPU: our kernels (every candidate of mma / wgmma / decode / decode_ring verified, then the
best timed) against cuDNN and FlashAttention-2 through torch, in one run.

    PYTHONPATH=. python3 benchmarks/bench_attention.py [--quick] [--only SUBSTRING]

TFLOP/s = 4·B·Hq·Sq·Skv·D (halved for causal); forward+backward counts 3.5x that. Decode rows
report GB/s over the minimum bytes and the share of the copy bandwidth measured in this run.
``plan`` is the best over every registered variant (ours and the vendor wrappers, as a tuned
plan would choose), each timed as the run-time pipeline calls it (a vendor wrapper on torch
tensors, returning the library's own outputs); ``plan_call`` is that choice put in a plan and
called as a user does, ``dnnctl.ops.attention(q, k, v, plan=...)`` on torch tensors, and
``plan/best_torch`` compares that call with the fastest torch backend.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "Attention (forward; backward where noted)"
BUDGET_S = 120.0

SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("bf16 B4 H32 S4096 D128", dict(batch=4, heads_q=32, seq_q=4096, head_dim=128,
                                    dtype="bfloat16")),
    ("bf16 B4 H32 S4096 D128 causal", dict(batch=4, heads_q=32, seq_q=4096, head_dim=128,
                                           dtype="bfloat16", causal="top_left")),
    ("fp16 B4 H32 S2048 D64", dict(batch=4, heads_q=32, seq_q=2048, head_dim=64,
                                   dtype="float16")),
    ("bf16 B4 H16 S4096 D256", dict(batch=4, heads_q=16, seq_q=4096, head_dim=256,
                                    dtype="bfloat16")),
    ("decode bf16 B8 q1 KV4096 GQA32/8 D128", dict(batch=8, heads_q=32, heads_kv=8, seq_q=1,
                                                   seq_kv=4096, head_dim=128,
                                                   dtype="bfloat16")),
    ("decode bf16 B32 q1 KV8192 GQA32/8 D128", dict(batch=32, heads_q=32, heads_kv=8,
                                                    seq_q=1, seq_kv=8192, head_dim=128,
                                                    dtype="bfloat16")),
]
BACKWARD: list[tuple[str, dict[str, Any]]] = [
    ("bf16 B4 H32 S4096 D128", SHAPES[0][1]),
    ("bf16 B4 H32 S4096 D128 causal", SHAPES[1][1]),
    ("fp16 B4 H32 S2048 D64", SHAPES[2][1]),
]


def _rel(torch: Any, y: Any, ref: Any) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def _torch_backend(torch: Any, q: Any, k: Any, v: Any, causal: bool, which: str,
                   gqa: bool) -> tuple[Any, Any]:
    """(forward fn, forward+backward fn) through F.sdpa restricted to one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[which]
    F = torch.nn.functional
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn_like(q)

    def fwd() -> Any:
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def fwd_bwd() -> None:
        with sdpa_kernel([be]):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
        o.backward(dout)

    return fwd, fwd_bwd


def _call_args(kern: Any, inputs: dict, outputs: dict, tinputs: dict) -> tuple[dict, dict]:
    """A kernel's arguments as the run-time pipeline passes them from torch tensors: an
    adopting kernel (a vendor wrapper) gets the torch tensors and no outputs."""
    from dnnctl.ops.dispatch import adopting

    return (tinputs, {}) if adopting(kern) else (inputs, outputs)


def _ours(op: Any, problem: Any, dev: Any, inputs: dict, outputs: dict, ref: Any,
          torch: Any, y: Any, names: tuple[str, ...], tinputs: dict
          ) -> tuple[float, str, int, list[str], Any]:
    """Best verified candidate of ``names``: (median us, label, tried, notes, Choice)."""
    from dnnctl.ops.base import Choice
    from dnnctl.ops.registry import get_variant

    best, label, tried, notes, choice = math.inf, "", 0, [], None
    for vname in names:
        variant = get_variant("attention", "cupy", vname)
        if not variant.supports(problem, dev):
            continue
        space = [c for c in variant.param_space(problem, dev) if _keep(vname, c)] or [{}]
        for params in space:
            try:
                kern = variant.build(problem, params, dev)
                ins, outs = _call_args(kern, inputs, outputs, tinputs)
                y.fill_(float("nan"))
                made = kern(ins, outs, {})
                torch.cuda.synchronize()
                err = _rel(torch, made["out"] if outs is not outputs else y, ref)
            except Exception as exc:  # reported; the run goes on
                notes.append(f"FAILED {vname}{params}: {type(exc).__name__}: {exc}"[:160])
                continue
            if not err < 2.5e-2:
                notes.append(f"WRONG {vname}{params} err {err:.3g}")
                continue
            tried += 1
            med = common.time_us(lambda k=kern, i=ins, o=outs: k(i, o, {}), warmup_ms=5,
                                 budget_ms=20)["median_us"]
            if med < best:
                best, label = med, f"{vname} {params}" if params else vname
                choice = Choice.of(vname, params)
    return best, label, tried, notes, choice


def _plan_call(torch: Any, fn: Any, ref: Any) -> float:
    """Median us of a user's planned call ``fn()`` (its first output checked against ref)."""
    got = fn()
    got = got[0] if isinstance(got, tuple) else got
    torch.cuda.synchronize()
    err = _rel(torch, got, ref)
    if not err < 2.5e-2:
        raise RuntimeError(f"the planned call's output is off (rel err {err:.3g})")
    return common.time_us(fn, warmup_ms=5, budget_ms=30)["median_us"]


def _keep(vname: str, params: dict[str, Any]) -> bool:
    """The candidates timed here (NVRTC compiles bound the run; the tuner tries them all)."""
    if vname == "decode":
        return params["splits"] in (4, 8, 16) and params["bn"] in (32, 64)
    if vname == "decode_ring":
        return params["warps"] >= 2
    if vname == "mma_bwd":
        return params["bm"] >= 64 and params["bn"] >= 64
    if vname == "wgmma":
        return params["stages"] == 2 and params["overlap"] == 1
    return True


def _backward_row(op: Any, dev: Any, name: str, key: dict[str, Any]) -> list[dict[str, Any]]:
    """Our backward (dq, dk, dv from the forward's out and lse) against cuDNN / FA2 backward
    through torch autograd (their backward = forward+backward minus forward)."""
    import cupy as cp
    import torch

    from dnnctl.ops.base import Choice
    from dnnctl.ops.registry import get_variant

    p = op.problem(dict(key, **{"pass": "backward"}))
    fp = op.problem(key)
    tdt = getattr(torch, key["dtype"])
    g = torch.Generator(device="cuda").manual_seed(1)
    b, h, s, d = p["batch"], p["heads_q"], p["seq_q"], p["head_dim"]
    q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", generator=g).to(tdt)
                     for _ in range(4))
    causal = p["causal"] != "none"
    row: dict[str, Any] = {"shape": "backward " + name}
    grads = None
    for which in ("cudnn", "flash"):
        try:
            fwd, fb = _torch_backend(torch, q, k, v, causal, which, False)
            t_f = common.time_us(fwd, budget_ms=40)["median_us"]
            t_fb = common.time_us(fb, budget_ms=60)["median_us"]
            row[f"{which}_bwd_us"] = t_fb - t_f
            row[f"{which}_bwd_TFLOPs"] = op.flops(p) / (t_fb - t_f) / 1e6
        except Exception as exc:
            row[f"{which}_note"] = f"{type(exc).__name__}: {exc}"[:100]
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(dout)
    grads = {"dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    fwd_v = get_variant("attention", "cupy", "mma")
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    ins = {n: cp.from_dlpack(t) for n, t in (("q", q), ("k", k), ("v", v))}
    fwd_v.build(fp, fwd_v.default_params(fp, dev), dev)(
        ins, {"out": cp.from_dlpack(out), "lse": cp.from_dlpack(lse)}, {})
    ins.update(out=cp.from_dlpack(out), dout=cp.from_dlpack(dout), lse=cp.from_dlpack(lse))
    tins = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse}
    res = {n: torch.empty_like(q) for n in ("dq", "dk", "dv")}
    outs = {n: cp.from_dlpack(t) for n, t in res.items()}
    best, label, notes, choice = math.inf, "", [], None
    for vname in ("wgmma_bwd", "mma_bwd", "torch_flash_bwd", "torch_cudnn_bwd"):
        variant = get_variant("attention", "cupy", vname)
        if not variant.supports(p, dev):
            continue
        for params in [c for c in variant.param_space(p, dev) if _keep(vname, c)] or [{}]:
            try:
                kern = variant.build(p, params, dev)
                cins, couts = _call_args(kern, ins, outs, tins)
                made = kern(cins, couts, {})
                got = made if couts is not outs else res
                torch.cuda.synchronize()
                err = max(_rel(torch, got[n], grads[n]) for n in res)
            except Exception as exc:
                notes.append(f"FAILED {vname}{params}: {type(exc).__name__}: {exc}"[:160])
                continue
            if not err < 5e-2:
                notes.append(f"WRONG {vname}{params} err {err:.3g}")
                continue
            med = common.time_us(lambda k=kern, i=cins, o=couts: k(i, o, {}), warmup_ms=5,
                                 budget_ms=30)["median_us"]
            row[f"{vname}_us"] = min(med, row.get(f"{vname}_us", math.inf))
            if med < best:
                best, label = med, f"{vname} {params}"
                choice = Choice.of(vname, params)
    ours = min(row.get("wgmma_bwd_us", math.inf), row.get("mma_bwd_us", math.inf))
    row.update({"ours_TFLOPs": op.flops(p) / ours / 1e6, "plan_choice": label,
                "plan_TFLOPs": op.flops(p) / best / 1e6})
    if choice is not None:
        import _torch_bench as tb

        import dnnctl

        lp = tb.plan_with([(p, choice)])
        try:
            call = _plan_call(torch, lambda: dnnctl.ops.attention_backward(
                dout, q, k, v, out, lse, causal=p["causal"], plan=lp), grads["dq"])
            row["plan_call_TFLOPs"] = op.flops(p) / call / 1e6
            best_torch = min(row.get(f"{w}_bwd_us", math.inf) for w in ("cudnn", "flash"))
            row["plan/best_torch"] = best_torch / call
        except Exception as exc:
            notes.append(f"planned call: {type(exc).__name__}: {exc}"[:160])
    if "cudnn_bwd_us" in row:
        row["ours/cudnn"] = row["cudnn_bwd_us"] / ours
    return [row] + [{"shape": "backward " + name, "note": n} for n in notes[:4]]


def run(ctx: common.Ctx, quick: bool) -> list[dict[str, Any]]:
    import cupy as cp
    import torch

    from dnnctl.ops.registry import get_op

    be = common.backend()
    dev = be.device(0)
    op = get_op("attention")
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    for name, key in SHAPES[:3] if quick else SHAPES:
        if only not in name:
            continue
        if time.time() - t0 > BUDGET_S:
            rows.append({"shape": name, "note": "skipped (time budget)"})
            continue
        p = op.problem(key)
        tdt = getattr(torch, key["dtype"])
        g = torch.Generator(device="cuda").manual_seed(0)
        b, hq, hkv = p["batch"], p["heads_q"], p["heads_kv"]
        sq, skv, d = p["seq_q"], p["seq_kv"], p["head_dim"]
        q = torch.randn(b, hq, sq, d, device="cuda", generator=g).to(tdt)
        k = torch.randn(b, hkv, skv, d, device="cuda", generator=g).to(tdt)
        v = torch.randn(b, hkv, skv, d, device="cuda", generator=g).to(tdt)
        causal = p["causal"] != "none"
        gqa = hq != hkv
        y = torch.empty(b, hq, sq, d, device="cuda", dtype=tdt)
        lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
        inputs = {n: cp.from_dlpack(t) for n, t in (("q", q), ("k", k), ("v", v))}
        outputs = {"out": cp.from_dlpack(y), "lse": cp.from_dlpack(lse)}
        flop = op.flops(p)
        row: dict[str, Any] = {"shape": name}
        vend: dict[str, float] = {}
        ref = None
        for which in ("cudnn", "flash"):
            try:
                fwd, fb = _torch_backend(torch, q, k, v, causal, which, gqa)
                out = fwd()
                ref = out if ref is None else ref
                vend[which] = common.time_us(fwd, budget_ms=60)["median_us"]
                if key["seq_q"] != 1:
                    vend[which + "_fb"] = common.time_us(fb, budget_ms=60)["median_us"]
            except Exception as exc:
                row[f"{which}_note"] = f"{type(exc).__name__}: {exc}"[:100]
        if ref is None:
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=gqa)
        tinputs = {"q": q, "k": k, "v": v}
        ours, label, tried, notes, own = _ours(op, p, dev, inputs, outputs, ref, torch, y,
                                               ("decode_ring", "decode", "wgmma", "mma"),
                                               tinputs)
        plan, plan_label, _, _, choice = _ours(op, p, dev, inputs, outputs, ref, torch, y,
                                               ("torch_flash", "torch_cudnn",
                                                "torch_efficient", "flash_attn"), tinputs)
        if ours < plan:
            plan, plan_label, choice = ours, label, own
        row.update({"ours_us": ours, "ours_TFLOPs": flop / ours / 1e6, "best": label,
                    "tried": tried})
        for which in ("cudnn", "flash"):
            if which in vend:
                row[f"{which}_us"] = vend[which]
                row[f"{which}_TFLOPs"] = flop / vend[which] / 1e6
                row[f"ours/{which}"] = vend[which] / ours
            if which + "_fb" in vend:
                row[f"{which}_fwdbwd_TFLOPs"] = 3.5 * flop / vend[which + "_fb"] / 1e6
        row["plan_us"] = plan
        row["plan_choice"] = plan_label
        best_vendor = min([vend[w] for w in ("cudnn", "flash") if w in vend] or [math.inf])
        if choice is not None:
            import _torch_bench as tb

            import dnnctl

            lp = tb.plan_with([(p, choice)])
            try:
                call = _plan_call(torch, lambda q=q, k=k, v=v, c=p["causal"], lp=lp:
                                  dnnctl.ops.attention(q, k, v, causal=c, plan=lp), ref)
                row["plan_call_us"] = call
                row["plan/best_torch"] = best_vendor / call
            except Exception as exc:
                notes.append(f"planned call: {type(exc).__name__}: {exc}"[:160])
        if p["seq_q"] <= 16:
            gbps = op.min_bytes(p) / ours / 1e3
            row["ours_GBps"] = gbps
            row["pct_copy_bw"] = 100.0 * gbps / ctx.copy_gbps
            if "cudnn" in vend:
                row["cudnn_GBps"] = op.min_bytes(p) / vend["cudnn"] / 1e3
        else:
            row["pct_bf16_peak"] = 100.0 * flop / ours / 1e6 / ctx.bf16_tflops
        rows.append(row)
        rows.extend({"shape": name, "note": n} for n in notes[:4])
    for name, key in BACKWARD:
        if only not in "backward " + name:
            continue
        if time.time() - t0 > BUDGET_S:
            rows.append({"shape": "backward " + name, "note": "skipped (time budget)"})
            continue
        try:
            rows.extend(_backward_row(op, dev, name, key))
        except Exception as exc:
            rows.append({"shape": "backward " + name, "note": f"{type(exc).__name__}: {exc}"})
    return rows


def main() -> int:
    quick = "--quick" in sys.argv
    ctx = common.measure_ceilings()
    rows = run(ctx, quick)
    text = ctx.header() + "\n\n" + common.markdown(rows)
    print(text, flush=True)
    out = Path(os.environ.get("OUT") or ".devout")
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_attention.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
