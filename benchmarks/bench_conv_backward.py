"""conv2d backward: dnnctl dgrad / wgrad (best candidate, and the default heuristic's pick)
vs torch/cuDNN as autograd calls it (aten::convolution_backward with one output of its mask
and the real x and w, cudnn.benchmark = True). Not torch.nn.grad.conv2d_input: its stride-0
stand-in for x sends an NHWC data gradient through torch's NCHW path, 1.6-8x slower.

Shapes: the training convolutions of ResNet-50 v1.5 (the 23 distinct layers of
bench_conv.py, no bias: batch norm follows each) and the ViT-B/16 patch embedding (3 -> 768,
16x16 stride 16 @224, with bias: its wgrad row also computes db, as torch's call does),
at batch 32 (DNNCTL_BENCH_BWD_BATCHES), in fp16 NHWC (channels_last)
and fp32 NCHW with TF32 allowed on both sides (DNNCTL_BENCH_TF32=0: strict fp32).

Per row, every registered backward variant that supports the problem proposes its default
parameters plus a shape-aware list (tensor-core variants: the tile menu of
conv_candidates.py scored on the variant's own GEMM, split-K up to 256 for wgrad); all
kernels are compiled first by a process pool. Each candidate is checked once against
cuDNN's result (a wrong one cannot win), timed once (hopeless ones stop there) and briefly
sampled; the three fastest, the default heuristic's pick and cuDNN are re-timed in three
interleaved rounds (CUDA events, L2 flushed before every sample; median of the rounds).
The summary's "best" geomean is what a tuned plan gets (cuDNN time / ours, > 1: faster);
cuDNN through torch is a candidate there (dgrad_torch_cudnn / wgrad_torch_cudnn), as it is for
the tuner, and "own" is the best of dnnctl's own kernels alone.

    PYTHONPATH=. python3 benchmarks/bench_conv_backward.py [--quick] [--passes dgrad,wgrad]
        [--configs fp16,fp32] [--batches 32]
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_conv  # noqa: E402
import common  # noqa: E402
import conv_candidates as cc  # noqa: E402

TITLE = "conv2d backward (dgrad, wgrad): dnnctl best / default vs torch/cuDNN"
BUDGET_S = float(os.environ.get("DNNCTL_BENCH_BWD_S", "560"))
PRECOMPILE_S = 180.0
CONFIGS = (("float16", "NHWC"), ("float32", "NCHW"))
PASSES = ("dgrad", "wgrad")
QUICK_LAYERS = ("conv1 7x7/2", "s1 3x3 64->64 @56", "s2 3x3 128->128 @56/2",
                "s3 1x1b 256->1024 @14", "s4 3x3 512->512 @7", "vit-b/16 patch 16x16/16")
WGRAD_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FINALISTS = 3
ROUNDS = 3
PRUNE = 4.0


def layers() -> list[tuple[str, dict[str, int]]]:
    """ResNet-50 v1.5's distinct convolutions and the ViT-B/16 patch embedding."""
    vit = ("vit-b/16 patch 16x16/16", dict(c=3, h=224, k=768, r=16, stride=16, pad=0,
                                           bias=1))
    return bench_conv.resnet50_layers() + [vit]


@dataclass(frozen=True)
class Row:
    layer: str
    shape: tuple[tuple[str, int], ...]
    batch: int
    dtype: str
    layout: str
    tf32: bool
    which: str

    @property
    def config(self) -> str:
        return f"{self.dtype} {self.layout}"

    def key(self) -> dict[str, Any]:
        s = dict(self.shape)
        return dict(n=self.batch, c=s["c"], h=s["h"], w=s["h"], k=s["k"], r=s["r"], s=s["r"],
                    stride=s["stride"], pad=s["pad"], groups=s.get("groups", 1),
                    dtype=self.dtype, layout=self.layout,
                    bias=bool(s.get("bias")) and self.which == "wgrad",
                    tf32=self.tf32 and self.dtype == "float32", **{"pass": self.which})


def plan_rows(quick: bool, tf32: bool, batches: Sequence[int] = (32,),
              configs: Sequence[tuple[str, str]] = CONFIGS,
              passes: Sequence[str] = PASSES) -> list[Row]:
    """Rows in run order: per batch and config, dgrad then wgrad of every layer."""
    ls = layers()
    if quick:
        ls = [e for e in ls if e[0] in QUICK_LAYERS]
    return [Row(name, tuple(sorted(shape.items())), b, dt, lay, tf32, which)
            for b in batches for dt, lay in configs for which in passes for name, shape in ls]


# ----------------------------------------------------------------------------- candidates


def gemm_shape(name: str, g: Any) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of the GEMM a backward tensor-core variant runs (per stride phase
    for dgrad)."""
    if name.startswith("wgrad"):
        return g.kg, g.r * g.s * g.cg, g.npq, g.groups
    phases = g.sh * g.sw
    return (g.n * g.h * g.w // phases, g.cg, max(1, g.kg * g.r * g.s // phases), g.groups)


def _tc(variant: Any, problem: Any, g: Any, default: dict[str, Any],
        device: Any) -> list[dict[str, Any]]:
    m, n, k, batch = gemm_shape(variant.name, g)
    sms = getattr(device, "sm_count", 0) or 132
    eb = 2 if g.dtype in ("float16", "bfloat16") else 4
    splits = tuple(s for s in WGRAD_SPLITS if s in variant.params["splitk"])
    scored, seen = [], set()
    for tile, sk in itertools.product(cc.TC_TILES, splits):
        bm, bn, bk, warps, stages = (cc._snap(v, variant.params[key]) for v, key in zip(
            tile, ("bm", "bn", "bk", "warps", "stages")))
        p = dict(default, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, splitk=sk)
        ident = tuple(sorted(p.items()))
        if ident in seen or p == default:
            continue
        seen.add(ident)
        if cc._valid(variant, problem, p, device):
            scored.append((cc.tc_score(p, m, n, k, batch, sms, eb), len(scored), p))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [p for _, _, p in scored[:cc.TC_KEEP]]


def shortlist(variant: Any, problem: Any, device: Any) -> list[dict[str, Any]]:
    """Parameter sets of a backward ``variant`` worth timing on ``problem`` (default
    first); [] when it does not support the problem or cannot compete."""
    from dnnctl.ops.conv2d.op import default_params, geometry

    if not variant.supports(problem, device):
        return []
    g = geometry(problem)
    if variant.name.endswith("_direct") and not g.depthwise \
            and 2.0 * g.npq * g.k * g.crs > cc.DIRECT_MAX_FLOPS:
        return []
    if variant.name == "dgrad_fft" and g.r * g.s < cc.FFT_MIN_TAPS:
        return []
    default = default_params(variant, problem, device)
    if default is None or not cc._valid(variant, problem, default, device):
        return []
    out = [default]
    if set(variant.params) >= cc.TC_KEYS:
        out += _tc(variant, problem, g, default, device)
    elif variant.name in ("dgrad_winograd",):
        out += cc._around(variant, problem, default, device, [dict(tile=2), dict(tile=4)])
    else:
        out += cc._spread(variant, problem, default, device, 2)
    return out


def candidates(problem: Any, device: Any) -> list[tuple[Any, dict[str, Any]]]:
    """(variant, params) of every backward variant's shortlist, the default's pick included."""
    from dnnctl.ops.registry import get_op, get_variant, variants

    out = [(v, p) for v in variants("conv2d", "cupy") if problem["pass"] in v.passes
           for p in shortlist(v, problem, device)]
    choice = get_op("conv2d").default_choice(problem, "cupy", device)
    if not any(v.name == choice.variant and p == choice.param_dict for v, p in out):
        out.append((get_variant("conv2d", "cupy", choice.variant), choice.param_dict))
    return out


def record_jobs(rows: Sequence[Row], device: Any) -> list[tuple]:
    from dnnctl.ops.precompile import record_builds
    from dnnctl.ops.registry import get_op

    op = get_op("conv2d")
    problems = [op.problem(row.key()) for row in rows]
    return record_builds(((v, p, prm) for p in problems for v, prm in candidates(p, device)),
                         device)


# ----------------------------------------------------------------------------- timing


def _torch_case(row: Row) -> tuple[Callable[[], Any], dict[str, Any], Any]:
    """cuDNN's gradient call, our inputs (CuPy views of the same tensors) and the reference
    outputs (cuDNN's, as float32 CuPy arrays in our layout)."""
    import cupy as cp
    import torch

    k = row.key()
    c, h, kk, r, st, pad, groups, n = (k[x] for x in ("c", "h", "k", "r", "stride", "pad",
                                                       "groups", "n"))
    tdt = getattr(torch, row.dtype)
    dev = torch.device("cuda")
    fmt = torch.channels_last if row.layout == "NHWC" else torch.contiguous_format
    x = torch.randn(n, c, h, h, device=dev).to(tdt).contiguous(memory_format=fmt)
    w = (torch.randn(kk, c // groups, r, r, device=dev) / math.sqrt(c // groups * r * r)).to(
        tdt).contiguous(memory_format=fmt)
    p = (h + 2 * pad - r) // st + 1
    dy = (torch.randn(n, kk, p, p, device=dev) / (1.0 if row.which == "dgrad" else
                                                  math.sqrt(n * p * p))).to(tdt)
    dy = dy.contiguous(memory_format=fmt)
    backward = torch.ops.aten.convolution_backward.default
    perm = (lambda t: t.permute(0, 2, 3, 1)) if row.layout == "NHWC" else (lambda t: t)
    if row.which == "dgrad":
        def fn() -> Any:
            return backward(dy, x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0],
                            groups, [True, False, False])[0]

        ins = {"dy": cp.from_dlpack(perm(dy).detach()), "w": cp.from_dlpack(perm(w).detach())}
        refs = {"dx": fn()}
    else:
        def fn() -> Any:
            _, dw, db = backward(dy, x, w, [kk] if k["bias"] else None, [st, st], [pad, pad],
                                 [1, 1], False, [0, 0], groups, [False, True, k["bias"]])
            return (dw, db) if k["bias"] else dw

        ins = {"x": cp.from_dlpack(perm(x).detach()), "dy": cp.from_dlpack(perm(dy).detach())}
        out = fn()
        refs = {"dw": out[0], "db": out[1]} if k["bias"] else {"dw": out}
    refs = {name: cp.from_dlpack((perm(t) if t.dim() == 4 else t).contiguous()).astype(
        cp.float32) for name, t in refs.items()}
    return fn, ins, refs


def _one_call_us(fn: Callable[[], None]) -> float:
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3


def bench_row(row: Row) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        return _bench_row(row, stack)


def _bench_row(row: Row, stack: contextlib.ExitStack) -> dict[str, Any]:
    import cupy as cp

    from dnnctl.ops.registry import get_op

    op = get_op("conv2d")
    dev = common.backend().device(cp.cuda.Device().id)
    problem = op.problem(row.key())
    torch_fn, inputs, refs = _torch_case(row)
    outs = {name: cp.empty(spec.shape, dtype=inputs[next(iter(inputs))].dtype)
            for name, spec in op.output_specs(problem).items()}
    tol = 2e-2 if row.dtype != "float32" else 1e-2
    default = op.default_choice(problem, "cupy", dev)
    default_label = cc.label(default.variant, default.param_dict)
    cands: list[bench_conv.Cand] = []
    wrong = failed = pruned = 0
    for variant, params in candidates(problem, dev):
        name = cc.label(variant.name, params)
        try:
            kern = variant.build(problem, params, dev)
            for o in outs.values():
                o.fill(float("nan"))
            run, got = common.candidate_call(stack, variant, kern, inputs, outs)
            err = max(float(cp.linalg.norm(got[n].astype(cp.float32) - ref))
                      / max(float(cp.linalg.norm(ref)), 1e-30) for n, ref in refs.items())
        except Exception as exc:  # a failed candidate is skipped, as the tuner does
            failed += 1
            print(f"  [{row.config} {row.which} {row.layer}] {name}: {type(exc).__name__}: "
                  f"{str(exc)[:120]}", file=sys.stderr)
            continue
        if not err <= tol:
            wrong += 1
            print(f"  [{row.config} {row.which} {row.layer}] {name}: wrong ({err:.3g})",
                  file=sys.stderr)
            continue

        cand = bench_conv.Cand(name, variant.name, params, run, err)
        cands.append(cand)
        best = min(cd.quick_us for cd in cands)
        once = _one_call_us(run)
        if once > PRUNE * best:
            cand.quick_us = once
            pruned += 1
            continue
        cand.quick_us = common.time_us(run, warmup_ms=1, budget_ms=5)["median_us"]
    cands.sort(key=lambda cd: cd.quick_us)
    finals = cands[:FINALISTS]
    dflt = next((cd for cd in cands if cd.label == default_label), None)
    if dflt is not None and dflt not in finals:
        finals.append(dflt)
    own = next((cd for cd in cands if not _vendor(cd.variant)), None)  # dnnctl's kernels only
    if own is not None and own not in finals:
        finals.append(own)
    cudnn_rounds = []
    for _ in range(ROUNDS):
        cudnn_rounds.append(common.time_us(torch_fn, warmup_ms=2, budget_ms=12)["median_us"])
        for cd in finals:
            cd.rounds.append(common.time_us(cd.fn, warmup_ms=2, budget_ms=12)["median_us"])
    cudnn = statistics.median(cudnn_rounds)
    out: dict[str, Any] = {"config": row.config, "pass": row.which, "layer": row.layer,
                           "batch": row.batch}
    top = min(finals, key=lambda cd: cd.us) if finals else None
    flops = op.flops(problem)
    if top is None:
        out.update(best="(none)", ours_us=math.nan, cudnn_us=cudnn, ratio=math.nan)
    else:
        out.update(best=top.label, ours_us=top.us, cudnn_us=cudnn, ratio=cudnn / top.us,
                   ours_tflops=flops / top.us / 1e6, cudnn_tflops=flops / cudnn / 1e6)
    own_top = min((cd for cd in finals if not _vendor(cd.variant)), key=lambda cd: cd.us,
                  default=None)
    if own_top is not None:
        out.update(own=own_top.label, own_us=own_top.us, own_ratio=cudnn / own_top.us)
    if dflt is not None:
        out.update(default=default_label, default_us=dflt.us, default_ratio=cudnn / dflt.us)
    else:
        out.update(default=default_label + " (failed/wrong!)", default_us=math.nan,
                   default_ratio=math.nan)
    out.update(err_vs_cudnn=top.err if top is not None else math.nan,
               tried=len(cands) + wrong + failed, wrong=wrong, failed=failed, pruned=pruned)
    return out


def _vendor(variant: str) -> bool:
    from dnnctl.ops.registry import get_variant

    return get_variant("conv2d", "cupy", variant).vendor


def run(ctx: Any, quick: bool, batches: Sequence[int] = (32,),
        configs: Sequence[tuple[str, str]] = CONFIGS,
        passes: Sequence[str] = PASSES) -> list[dict[str, Any]]:
    import cupy as cp
    import torch

    t0 = time.time()
    torch.backends.cudnn.benchmark = True
    tf32 = os.environ.get("DNNCTL_BENCH_TF32", "1") != "0"
    torch.backends.cudnn.allow_tf32 = tf32
    rows = plan_rows(quick, tf32, batches, configs, passes)
    dev = common.backend().device(cp.cuda.Device().id)
    print(f"  {common.precompile(record_jobs, (list(rows), dev), PRECOMPILE_S, 150)}", flush=True)
    out: list[dict[str, Any]] = []
    skipped = 0
    for row in rows:
        if time.time() - t0 > BUDGET_S:
            skipped += 1
            continue
        try:
            out.append(bench_row(row))
        except Exception as exc:  # keep going; record the miss
            out.append({"config": row.config, "pass": row.which, "layer": row.layer,
                        "batch": row.batch,
                        "best": f"error: {type(exc).__name__}: {exc}"[:160]})
        r = out[-1]
        print(f"  {r['config']} {r['pass']} b{r['batch']} {r['layer']}: {r.get('best')} "
              f"{r.get('ours_us', math.nan):.1f} us vs cuDNN {r.get('cudnn_us', math.nan):.1f}"
              f" us", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if skipped:
        out.append({"config": "skipped (time budget)", "layer": f"{skipped} rows"})
    return out


def summary(rows: list[dict[str, Any]], ctx: Any) -> str:
    """Geomean of cuDNN time / ours (> 1: ours faster) for the best candidate (a tuned
    plan) and the default heuristic, overall, per pass and per config."""
    timed = [r for r in rows if isinstance(r.get("ratio"), float) and r["ratio"] > 0]
    groups: dict[str, list[dict[str, Any]]] = {"all": timed}
    for r in timed:
        groups.setdefault(r["pass"], []).append(r)
        groups.setdefault(f"{r['config']} {r['pass']}", []).append(r)
    lines = []
    for name, rs in groups.items():
        dr = [r["default_ratio"] for r in rs
              if isinstance(r.get("default_ratio"), float) and r["default_ratio"] > 0]
        orr = [r["own_ratio"] for r in rs
               if isinstance(r.get("own_ratio"), float) and r["own_ratio"] > 0]
        lines.append(f"- {name}: tuned geomean {common.geomean([r['ratio'] for r in rs]):.3f}"
                     f" over {len(rs)} shapes (cuDNN a candidate), dnnctl's own kernels "
                     f"{common.geomean(orr):.3f}, own faster on "
                     f"{sum(r >= 1 for r in orr)}; default heuristic geomean "
                     f"{common.geomean(dr):.3f}")
    misses = len(rows) - len(timed)
    if misses:
        lines.append(f"- not timed: {misses} rows (errors / skipped: see the table)")
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", default=os.environ.get("DNNCTL_BENCH_BWD_BATCHES", "32"))
    ap.add_argument("--configs", default="fp16,fp32", help="fp16 (NHWC) and/or fp32 (NCHW)")
    ap.add_argument("--passes", default="dgrad,wgrad")
    args = ap.parse_args()
    wanted = {"fp16": CONFIGS[0], "fp32": CONFIGS[1]}
    rows = run(None, args.quick, tuple(int(b) for b in args.batches.split(",") if b),
               tuple(wanted[c] for c in args.configs.split(",") if c in wanted),
               tuple(p for p in args.passes.split(",") if p in PASSES))
    print(common.markdown(rows))
    print(summary(rows, None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
