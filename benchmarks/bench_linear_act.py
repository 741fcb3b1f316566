"""linear + activation: dnnctl's fused-epilogue GEMMs against torch's F.linear + F.gelu.

What torch runs for ``F.gelu(F.linear(x, W, b))`` is a cuBLAS GEMM (bias in its epilogue)
and then a separate elementwise gelu kernel, which reads and writes the whole output once
more. dnnctl's candidates write the output once: ``cublaslt`` (cuBLASLt's GELU_BIAS
epilogue, tanh-form gelu), ``wgmma_tma`` (our TMA Hopper GEMM, erf gelu in its staged
epilogue; default parameters plus a few tiles), ``wgmma`` (the cp.async Hopper GEMM) and
``cublas`` (cuBLAS in bf16 + our in-place epilogue kernel, as torch). Every candidate is
checked against torch's fp32 result once (relative error < 1e-2) before it is timed.

Shapes (bf16, x @ W^T with W stored (out, in) as nn.Linear keeps it): GPT-style MLP up
projection M=8192, N=4*4096, K=4096; LLaMA-7B up/gate M=4096, N=11008, K=4096; BERT-base
MLP M=2048, N=3072, K=768; LLaMA-7B's gate projection + SiLU at prefill 2048 (cuBLASLt has
no SiLU epilogue); plus two large squares without an epilogue (plain GEMM rows,
torch.matmul against wgmma_tma and cublaslt).

    PYTHONPATH=. python3 benchmarks/bench_linear_act.py [--quick]
    PYTHONPATH=. python3 benchmarks/run.py --only linear_act [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "linear + gelu: dnnctl fused epilogues vs torch F.linear + F.gelu"
BUDGET_S = 420.0

# (name, m, n, k, activation, bias)
SHAPES = [
    ("gpt mlp up 8192x16384x4096 +gelu", 8192, 16384, 4096, "gelu", True),
    ("llama7b up 4096x11008x4096 +gelu", 4096, 11008, 4096, "gelu", True),
    ("bert mlp 2048x3072x768 +gelu", 2048, 3072, 768, "gelu", True),
    ("llama7b gate 2048x11008x4096 +silu", 2048, 11008, 4096, "silu", False),
    ("square 4096", 4096, 4096, 4096, "none", False),
    ("square 8192", 8192, 8192, 8192, "none", False),
]
# extra wgmma_tma tiles tried after its default (bm, bn, consumers, stages)
TMA_TILES = [(128, 256, 2, 4), (256, 128, 2, 4), (128, 128, 2, 6), (128, 256, 2, 3),
             (128, 128, 2, 4)]
VARIANTS = ("cublaslt", "wgmma_tma", "wgmma", "cublas")


def _candidates(variant: Any, problem: Any, dev: Any, quick: bool) -> list[dict[str, Any]]:
    own = variant.default_params(problem, dev) if hasattr(variant, "default_params") else {}
    out = [own if own is not None else {}]
    if variant.name == "wgmma_tma":
        for bm, bn, cons, stages in TMA_TILES[: 2 if quick else None]:
            p = {"bm": bm, "bn": bn, "consumers": cons, "stages": stages}
            if p not in out and variant.valid_params(problem, p, dev):
                out.append(p)
    return out


def _label(name: str, p: dict[str, Any]) -> str:
    if name == "wgmma_tma":
        return f"wgmma_tma {p['bm']}x{p['bn']} c{p['consumers']} s{p['stages']}"
    if name == "wgmma":
        return f"wgmma {p['bm']}x{p['bn']} w{p['warps']} s{p['stages']} sk{p['splitk']}"
    return name


def run(ctx: common.Ctx, quick: bool) -> list[dict[str, Any]]:
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from dnnctl.ops.registry import get_op, get_variant

    be = common.backend()
    dev = be.device(0)
    op = get_op("matmul")
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    for name, m, n, k, act, has_bias in SHAPES:
        if time.time() - t_start > BUDGET_S:
            rows.append({"shape": name, "note": "skipped (time budget)"})
            continue
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
        b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16) if has_bias else None

        fn = {"gelu": F.gelu, "silu": F.silu, "none": lambda t: t}[act]

        def torch_fn(x=x, w=w, b=b, fn=fn):
            return fn(F.linear(x, w, b))

        ref = fn(F.linear(x.float(), w.float(), None if b is None else b.float()))
        t_torch = common.time_us(torch_fn, budget_ms=80)["median_us"]
        problem = op.problem(dict(m=m, n=n, k=k, dtype="bfloat16", trans_b=True,
                                  bias=has_bias, activation=act))
        inputs = {"a": cp.from_dlpack(x), "b": cp.from_dlpack(w)}
        if b is not None:
            inputs["bias"] = cp.from_dlpack(b)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        outputs = {"y": cp.from_dlpack(y)}
        flop = 2.0 * m * n * k
        row: dict[str, Any] = {"shape": name, "torch_us": t_torch,
                               "torch_TFLOPs": flop / t_torch / 1e6}
        best: tuple[float, str] | None = None
        for vname in VARIANTS:
            variant = get_variant("matmul", "cupy", vname)
            why = variant.supports(problem, dev)
            if not why:
                row[f"{vname}_us"] = float("nan")
                rows.append({"shape": name, "note": f"{vname} unsupported: {why.reason}"})
                continue
            fam_best: tuple[float, str] | None = None
            for params in _candidates(variant, problem, dev, quick):
                label = _label(vname, params)
                try:
                    kern = variant.build(problem, params, dev)
                    y.fill_(float("nan"))
                    kern(inputs, outputs, {})
                    torch.cuda.synchronize()
                    err = float((y.float() - ref).norm() / ref.norm())
                except Exception as exc:  # a broken candidate is reported, the run goes on
                    rows.append({"shape": name, "note": f"FAILED {label}: "
                                 f"{type(exc).__name__}: {exc}"[:240]})
                    continue
                if not err < 1e-2:
                    rows.append({"shape": name, "note": f"WRONG {label} err {err:.3g}"})
                    continue
                med = common.time_us(lambda kern=kern, i=inputs, o=outputs: kern(i, o, {}),
                                     budget_ms=60)["median_us"]
                if fam_best is None or med < fam_best[0]:
                    fam_best = (med, label)
            if fam_best is None:
                row[f"{vname}_us"] = float("nan")
                continue
            row[f"{vname}_us"] = fam_best[0]
            if best is None or fam_best[0] < best[0]:
                best = fam_best
            if vname == "wgmma_tma":
                row["wgmma_tma_best"] = fam_best[1]
        if best is not None:
            row.update({"best_us": best[0], "best": best[1],
                        "ratio": t_torch / best[0], "best_TFLOPs": flop / best[0] / 1e6,
                        "tma_ratio": t_torch / row.get("wgmma_tma_us", float("nan")),
                        "lt_ratio": t_torch / row.get("cublaslt_us", float("nan"))})
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]], ctx: common.Ctx) -> str:
    timed = [r for r in rows if "ratio" in r]
    fused = [r for r in timed if "gelu" in r["shape"]]
    lines = []
    if fused:
        lines.append("linear+gelu, best dnnctl vs torch F.linear+F.gelu: geomean "
                     f"{common.geomean([r['ratio'] for r in fused]):.2f} (goal >= 1.2); "
                     + ", ".join(f"{r['shape']}: {r['ratio']:.2f} ({r['best']})"
                                 for r in fused))
    silu = [r for r in timed if "silu" in r["shape"]]
    if silu:
        lines.append("linear+silu, best dnnctl vs torch F.linear+F.silu: "
                     + ", ".join(f"{r['shape']}: {r['ratio']:.2f} ({r['best']}; cublas "
                                 f"{r['torch_us'] / r['cublas_us']:.2f})" for r in silu))
    sq = [r for r in timed if r["shape"].startswith("square")]
    if sq:
        lines.append("large bf16 squares, wgmma_tma vs torch.matmul: "
                     + ", ".join(f"{r['shape']}: {r['tma_ratio']:.2f}" for r in sq)
                     + " (goal >= 0.9)")
    notes = [r for r in rows if "note" in r]
    if notes:
        lines.append("Notes: " + "; ".join(f"{r['shape']}: {r['note']}" for r in notes))
    return "\n".join(lines)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    c = common.measure_ceilings()
    print(c.header())
    r = run(c, quick)
    print(common.markdown(r))
    print(summary(r, c))
