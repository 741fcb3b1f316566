"""matmul: dnnctl's tensor-core GEMMs (wgmma_tma, wgmma, mma) against torch.matmul (cuBLAS).

Shapes: large squares (4096, 8192) and the LLaMA-7B decoder projections, x @ W^T with W the
(out, in) weight as nn.Linear stores it, at m = 16, 32, 64, 128 tokens (skinny: split-K
territory) and m = 4096 (prefill). For each shape our ``wgmma_tma`` (Hopper: TMA,
warp-specialized, persistent), ``wgmma`` (Hopper, cp.async), ``mma`` and ``mma_atomic``
variants run their default parameters plus a fixed candidate list per variant (the
variants' valid_params filters it; capped per variant); each candidate is checked once
against torch's output (a wrong one cannot win and is listed), timed briefly; the fastest is
re-timed with the full budget next to torch. Columns: times, ratio torch/ours (> 1: ours
faster), TFLOP/s of both, ours as % of the bf16 ceiling measured in this run (torch bf16
8192^3), and the best brief time of each variant family (wgmma_tma_us, wgmma_us,
mma_us). --quick: bf16 4096^3 and 8192^3, fp16 4096^3, LLaMA m = 16 and 128.

    PYTHONPATH=. python3 benchmarks/run.py --only gemm [--quick]
    PYTHONPATH=. python3 benchmarks/bench_gemm.py [--quick]
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "matmul: dnnctl tensor-core GEMMs (wgmma, mma.sync) vs torch.matmul (cuBLAS)"
BUDGET_S = 240.0

# (bm, bn, bk, warps, stages): what mma.sync kernels of this structure usually like on H100
TILES = [(128, 128, 32, 4, 4), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3),
         (128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (128, 128, 32, 4, 5),
         (64, 128, 64, 4, 4), (32, 128, 64, 4, 4), (16, 128, 64, 4, 4), (16, 256, 64, 8, 4),
         (64, 256, 32, 8, 4)]
# (bm, bn, bk, warps, stages) of the Hopper wgmma kernel: 128 x 256 with two warpgroups first
# (swap=1 tiles: bm runs over n, bn over the few tokens)
WG_TILES = [(128, 256, 64, 8, 4), (256, 128, 64, 8, 4), (128, 256, 64, 8, 3),
            (128, 128, 64, 8, 5), (128, 16, 64, 4, 6), (128, 128, 64, 8, 3),
            (64, 128, 64, 4, 6),
            (128, 32, 64, 4, 6), (64, 256, 64, 4, 4), (128, 128, 64, 4, 5),
            (64, 16, 64, 4, 6), (256, 16, 64, 8, 6), (64, 64, 64, 4, 6), (128, 64, 64, 8, 6)]
SPLITS = (4, 8, 2, 16, 1)  # skinny shapes want a few splits: try those first
# candidates per variant (quick, full)
CAPS = {"wgmma_tma": (4, 6), "wgmma": (8, 12), "mma": (4, 8), "mma_atomic": (2, 4)}
# (bm, bn, consumers, stages) of the TMA Hopper kernel (wgmma_tma), after its default
TMA_TILES = [(128, 256, 2, 4), (256, 128, 2, 4), (128, 128, 2, 6), (128, 256, 2, 3),
             (64, 128, 1, 6), (64, 256, 1, 4)]


def shapes(quick: bool) -> list[tuple[str, str, dict[str, int]]]:
    """(name, dtype, key) — trans_b marks x @ W^T with W stored (n, k)."""
    out = []
    for dt in ("bfloat16", "float16"):
        for s in ((4096, 8192) if not quick or dt == "bfloat16" else (4096,)):
            out.append((f"square {s}", dt, dict(m=s, n=s, k=s)))
    proj = [("q/k/v/o 4096x4096", 4096, 4096), ("up/gate 4096->11008", 11008, 4096),
            ("down 11008->4096", 4096, 11008)]
    for m in ((16, 128) if quick else (16, 32, 64, 128, 4096)):
        for pname, n, k in proj:
            out.append((f"llama7b {pname} m={m}", "bfloat16", dict(m=m, n=n, k=k,
                                                                    trans_b=True)))
    if not quick:
        out.append(("llama7b up m=16 fp16", "float16", dict(m=16, n=11008, k=4096,
                                                             trans_b=True)))
    return out


def candidates(variant: Any, problem: Any, dev: Any) -> list[dict[str, Any]]:
    out = []
    own = variant.default_params(problem, dev)
    if own is not None:
        out.append(own)
    if variant.name == "wgmma_tma":
        for bm, bn, cons, stages in TMA_TILES:
            p = {"bm": bm, "bn": bn, "consumers": cons, "stages": stages}
            if p not in out and variant.valid_params(problem, p, dev):
                out.append(p)
        return out
    extra = {k: v for k, v in variant.params.items() if k in ("reduce", "pipe", "swap")}
    per_tile = []
    for bm, bn, bk, warps, stages in (WG_TILES if variant.name == "wgmma" else TILES):
        mine = []
        for splitk in SPLITS:
            for values in itertools.product(*extra.values()):
                p = {"bm": bm, "bn": bn, "bk": bk, "warps": warps, "stages": stages,
                     "splitk": splitk, **dict(zip(extra, values))}
                if variant.check_params(p) is None and variant.valid_params(problem, p, dev):
                    mine.append(p)
        per_tile.append(mine)
    # round robin over the tiles, so a capped list still spans every tile shape
    for i in range(max((len(t) for t in per_tile), default=0)):
        for mine in per_tile:
            if i < len(mine) and mine[i] not in out:
                out.append(mine[i])
    return out


def _label(vname: str, p: dict[str, Any]) -> str:
    if vname == "wgmma_tma":
        return f"wgmma_tma {p['bm']}x{p['bn']} c{p['consumers']} s{p['stages']}"
    return (f"{vname} {p['bm']}x{p['bn']}x{p['bk']} w{p['warps']} s{p['stages']} "
            f"sk{p['splitk']}"
            + (f" {p['reduce']}" if p.get("reduce") and p["splitk"] > 1 else "")
            + (f" {p['pipe']}" if p.get("pipe") else "")
            + (" swap" if p.get("swap") else ""))


def _bind(kern: Any, inputs: dict, outputs: dict) -> Any:
    return lambda: kern(inputs, outputs, {})


def _rel_err(torch: Any, y: Any, ref: Any) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def run(ctx: common.Ctx, quick: bool) -> list[dict[str, Any]]:
    import cupy as cp
    import torch

    from dnnctl.ops.registry import get_op, get_variant

    be = common.backend()
    dev = be.device(0)
    op = get_op("matmul")
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    for name, dt, key in shapes(quick):
        if time.time() - t_start > BUDGET_S:
            rows.append({"shape": name, "dtype": dt, "note": "skipped (time budget)"})
            continue
        m, n, k = key["m"], key["n"], key["k"]
        tdt = getattr(torch, dt)
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g).to(tdt)
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(tdt)
        b = w.t() if key.get("trans_b") else w.t().contiguous()
        ref = (a.float() @ b.float())
        t_torch = common.time_us(lambda a=a, b=b: torch.matmul(a, b), budget_ms=80)
        problem = op.problem(dict(key, dtype=dt))
        inputs = {"a": cp.from_dlpack(a), "b": cp.from_dlpack(w if key.get("trans_b") else b)}
        y = torch.empty(m, n, device="cuda", dtype=tdt)
        outputs = {"y": cp.from_dlpack(y)}
        best: tuple[float, str, dict] | None = None
        tried = 0
        fam: dict[str, float] = {}
        for vname in ("wgmma_tma", "wgmma", "mma", "mma_atomic"):
            variant = get_variant("matmul", "cupy", vname)
            if not variant.supports(problem, dev):
                continue
            cap = CAPS[vname][0 if quick else 1]
            for params in candidates(variant, problem, dev)[:cap]:
                try:
                    kern = variant.build(problem, params, dev)
                    y.fill_(float("nan"))
                    kern(inputs, outputs, {})
                    torch.cuda.synchronize()
                    err = _rel_err(torch, y, ref)
                except Exception as exc:  # a broken candidate is reported, the run goes on
                    rows.append({"shape": name, "dtype": dt, "note":
                                 f"FAILED {vname}{params}: {type(exc).__name__}: {exc}"[:200]})
                    continue
                if not err < 1e-2:
                    rows.append({"shape": name, "dtype": dt, "note":
                                 f"WRONG {vname}{params} err {err:.3g}"})
                    continue
                tried += 1
                med = common.time_us(_bind(kern, inputs, outputs), warmup_ms=5,
                                     budget_ms=15)["median_us"]
                key_f = vname if vname.startswith("wgmma") else "mma"
                fam[key_f] = min(fam.get(key_f, med), med)
                if best is None or med < best[0]:
                    best = (med, vname, params)
        if best is None:
            rows.append({"shape": name, "dtype": dt, "note": "no candidate ran"})
            continue
        variant = get_variant("matmul", "cupy", best[1])
        kern = variant.build(problem, best[2], dev)
        ours = common.time_us(_bind(kern, inputs, outputs), budget_ms=80)
        flop = 2.0 * m * n * k
        p = best[2]
        rows.append({
            "shape": name, "dtype": dt, "m": m, "n": n, "k": k,
            "torch_us": t_torch["median_us"], "ours_us": ours["median_us"],
            "ratio": t_torch["median_us"] / ours["median_us"],
            "torch_TFLOPs": flop / t_torch["median_us"] / 1e6,
            "ours_TFLOPs": flop / ours["median_us"] / 1e6,
            "pct_bf16_peak": 100.0 * flop / ours["median_us"] / 1e6 / ctx.bf16_tflops,
            "best": _label(best[1], p),
            "tried": tried,
            "wgmma_tma_us": fam.get("wgmma_tma", float("nan")),
            "wgmma_us": fam.get("wgmma", float("nan")), "mma_us": fam.get("mma", float("nan")),
        })
    return rows


def summary(rows: list[dict[str, Any]], ctx: common.Ctx) -> str:
    timed = [r for r in rows if "ratio" in r]
    square = [r["ratio"] for r in timed if r["shape"].startswith("square")]
    skinny = [r["ratio"] for r in timed if r["m"] <= 128]
    wins = sum(r["ratio"] > 1.0 for r in timed)
    lines = [f"Shapes timed: {len(timed)}; ours faster on {wins}."]
    if square:
        lines.append(f"Large squares: geomean ratio torch/ours {common.geomean(square):.2f} "
                     f"(goal >= 0.9).")
    if skinny:
        lines.append(f"Skinny (m <= 128): geomean ratio {common.geomean(skinny):.2f} "
                     f"(goal > 1).")
    missed = [r for r in rows if "note" in r]
    if missed:
        lines.append("Not timed: " + "; ".join(f"{r['shape']} {r['dtype']}: {r['note']}"
                                               for r in missed))
    return "\n".join(lines)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    c = common.measure_ceilings()
    print(c.header())
    r = run(c, quick)
    print(common.markdown(r))
    print(summary(r, c))
