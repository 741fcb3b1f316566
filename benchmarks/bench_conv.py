"""conv2d: dnnctl (best candidate, and the default heuristic's pick) vs torch/cuDNN.

Shapes: the 23 distinct convolutions of ResNet-50 v1.5 (torchvision: stride on the 3x3; v1,
with the stride on the first 1x1, has 20) and the 10 distinct depthwise 3x3 layers of
MobileNetV2 1.0 @224, at batch 1, 32 and 256, in fp16 NHWC and fp32 NCHW. Every layer carries
a bias (batch norm folded), as an inference graph runs it; torch gets the same tensors
(channels_last for NHWC) with torch.backends.cudnn.benchmark = True. fp32 rows allow TF32 on
both sides, as torch does by default for cuDNN convolutions (torch.backends.cudnn.allow_tf32);
DNNCTL_BENCH_TF32=0 makes both strict fp32.

Per shape, every registered cupy conv2d variant that supports it proposes its default
parameters plus a short shape-aware list (benchmarks/conv_candidates.py: tile menus with
split-K for the tensor-core variants, block shapes for depthwise, ...), and the default
heuristic's choice is always among them. All kernels are compiled first by a pool of
processes into CuPy's on-disk cache. Each candidate is checked once against torch's output
(a wrong one cannot win), timed once (hopeless ones stop there) and briefly sampled; the
three fastest, the default heuristic's pick and cuDNN are then re-timed in three
interleaved rounds (CUDA events, L2 flushed before every sample; the median of the rounds'
medians). Rows are run in priority order (batch 32, batch 1, then batch 256 fp16 NHWC, then
batch 256 fp32 NCHW) within a time budget (DNNCTL_BENCH_CONV_S, default 285 s including the
compile); rows it cannot reach are listed as skipped, never silently dropped.

    PYTHONPATH=. python3 benchmarks/run.py --only conv [--quick]
    PYTHONPATH=. python3 benchmarks/bench_conv.py [--quick] [--batches 1,32] [--configs fp16]
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import conv_candidates  # noqa: E402

TITLE = "conv2d: dnnctl best candidate and default heuristic vs torch/cuDNN (benchmark=True)"
BUDGET_S = float(os.environ.get("DNNCTL_BENCH_CONV_S", "285"))
PRECOMPILE_S = 150.0  # the compile pool stops being waited for after this
CONFIGS = (("float16", "NHWC"), ("float32", "NCHW"))
QUICK_LAYERS = ("conv1 7x7/2", "s1 3x3 64->64 @56", "s2 3x3 128->128 @56/2",
                "s3 1x1b 256->1024 @14", "s4 3x3 512->512 @7", "mbv2 dw 96 @112/2",
                "mbv2 dw 576 @14")
FINALISTS = 3
ROUNDS = 3
PRUNE = 4.0  # a candidate whose single call is this much slower than the best is not sampled


def resnet50_layers() -> list[tuple[str, dict[str, int]]]:
    """Distinct convolutions of ResNet-50 v1.5: (name, c, h, k, r, stride, pad)."""
    out = [("conv1 7x7/2", dict(c=3, h=224, k=64, r=7, stride=2, pad=3))]
    seen = {(3, 224, 64, 7, 2)}
    cin, h = 64, 56
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                      (512, 3, 2)), start=1):
        cout = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            h2 = h // s
            convs = [("1x1a", cin, h, width, 1, 1), ("3x3", width, h, width, 3, s)]
            if b == 0:
                convs.append(("proj", cin, h, cout, 1, s))
            convs.append(("1x1b", width, h2, cout, 1, 1))
            for tag, c, hh, k, r, st in convs:
                if (c, hh, k, r, st) in seen:
                    continue
                seen.add((c, hh, k, r, st))
                name = f"s{stage} {tag} {c}->{k} @{hh}" + (f"/{st}" if st > 1 else "")
                out.append((name, dict(c=c, h=hh, k=k, r=r, stride=st, pad=r // 2)))
            h, cin = h2, cout
    return out


def mobilenet_v2_depthwise() -> list[tuple[str, dict[str, int]]]:
    """Distinct depthwise 3x3 layers of MobileNetV2 1.0 at 224x224."""
    spec = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))
    out, seen = [], set()
    cin, h = 32, 112
    for t, c, n, s in spec:
        for i in range(n):
            st = s if i == 0 else 1
            hidden = cin * t
            if (hidden, h, st) not in seen:
                seen.add((hidden, h, st))
                out.append((f"mbv2 dw {hidden} @{h}" + (f"/{st}" if st > 1 else ""),
                            dict(c=hidden, h=h, k=hidden, r=3, stride=st, pad=1,
                                 groups=hidden)))
            h, cin = -(-h // st), c
    return out


@dataclass(frozen=True)
class Row:
    """One benchmark row: a layer at a batch size, dtype and layout."""

    layer: str
    shape: tuple[tuple[str, int], ...]
    batch: int
    dtype: str
    layout: str
    tf32: bool

    @property
    def config(self) -> str:
        return f"{self.dtype} {self.layout}"

    def key(self) -> dict[str, Any]:
        s = dict(self.shape)
        return dict(n=self.batch, c=s["c"], h=s["h"], w=s["h"], k=s["k"], r=s["r"], s=s["r"],
                    stride=s["stride"], pad=s["pad"], groups=s.get("groups", 1),
                    dtype=self.dtype, layout=self.layout, bias=True,
                    tf32=self.tf32 and self.dtype == "float32")


def plan_rows(quick: bool, tf32: bool, batches: Sequence[int] = (1, 32, 256),
              configs: Sequence[tuple[str, str]] = CONFIGS) -> list[Row]:
    """Rows in the order they are run: batch 32, batch 1, batch 256 fp16, batch 256 fp32."""
    layers = resnet50_layers() + mobilenet_v2_depthwise()
    if quick:
        layers = [entry for entry in layers if entry[0] in QUICK_LAYERS]
        batches = (32,)
    order = sorted(((b, cfg) for b in batches for cfg in configs),
                   key=lambda bc: ({32: 0, 1: 1}.get(bc[0], 2), CONFIGS.index(bc[1])
                                   if bc[1] in CONFIGS else 9, bc[0]))
    return [Row(name, tuple(sorted(shape.items())), b, dt, lay, tf32)
            for b, (dt, lay) in order for name, shape in layers]


# ----------------------------------------------------------------------------- compile


def record_jobs(rows: Sequence[Row], device: Any) -> list[tuple]:
    """The (source, defines, names) of every module the rows' candidates build, in order;
    runs in a child process so nothing it builds is kept."""
    from dnnctl.ops.precompile import record_builds
    from dnnctl.ops.registry import get_op

    op = get_op("conv2d")
    problems = [op.problem(row.key()) for row in rows]
    return record_builds(((variant, problem, params) for problem in problems
                          for variant, params in conv_candidates.candidates(problem, device)),
                         device)


# ----------------------------------------------------------------------------- timing


@dataclass
class Cand:
    label: str
    variant: str
    params: dict[str, Any]
    fn: Callable[[], None]
    err: float
    quick_us: float = math.inf
    rounds: list[float] = field(default_factory=list)

    @property
    def us(self) -> float:
        return statistics.median(self.rounds) if self.rounds else self.quick_us


def _one_call_us(fn: Callable[[], None]) -> float:
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3


def bench_row(row: Row) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:  # torch views of the inputs, for vendor calls
        return _bench_row(row, stack)


def _bench_row(row: Row, stack: contextlib.ExitStack) -> dict[str, Any]:
    import cupy as cp
    import torch

    from dnnctl.ops.conv2d.op import own_choice
    from dnnctl.ops.registry import get_op

    op = get_op("conv2d")
    dev = common.backend().device(cp.cuda.Device().id)
    problem = op.problem(row.key())
    k = row.key()
    c, h, kk, r = k["c"], k["h"], k["k"], k["r"]
    st, pad, groups, batch = k["stride"], k["pad"], k["groups"], k["n"]
    tdt = getattr(torch, row.dtype)
    tdev = torch.device("cuda")
    x = torch.randn(batch, c, h, h, device=tdev).to(tdt)
    w = (torch.randn(kk, c // groups, r, r, device=tdev) / math.sqrt(c // groups * r * r)).to(
        tdt)
    b = torch.randn(kk, device=tdev).to(tdt)
    fmt = torch.channels_last if row.layout == "NHWC" else torch.contiguous_format
    x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    f = torch.nn.functional

    def torch_fn() -> Any:
        return f.conv2d(x, w, b, stride=st, padding=pad, groups=groups)

    ref = torch_fn()  # cudnn.benchmark: the first call picks cuDNN's algorithm
    perm = (lambda t: t.permute(0, 2, 3, 1)) if row.layout == "NHWC" else (lambda t: t)
    inputs = {"x": cp.from_dlpack(perm(x).detach()), "w": cp.from_dlpack(perm(w).detach()),
              "bias": cp.from_dlpack(b)}
    ref_cp = cp.from_dlpack(perm(ref).contiguous()).astype(cp.float32)
    ref_norm = float(cp.linalg.norm(ref_cp))
    y = cp.empty(op.output_specs(problem)["y"].shape, dtype=inputs["x"].dtype)
    tol = 2e-2 if row.dtype != "float32" else 1e-2
    default = own_choice(problem, "cupy", dev)  # our heuristic, held against cuDNN
    default_label = conv_candidates.label(default.variant, default.param_dict)
    cands: list[Cand] = []
    wrong = failed = pruned = 0
    notes: list[str] = []
    for variant, params in conv_candidates.candidates(problem, dev):
        name = conv_candidates.label(variant.name, params)
        try:
            kern = variant.build(problem, params, dev)
            y.fill(float("nan"))
            run, got = common.candidate_call(stack, variant, kern, inputs, {"y": y})
            err = float(cp.linalg.norm(got["y"].astype(cp.float32) - ref_cp)) / ref_norm
        except Exception as exc:  # a failed candidate is skipped, as the tuner does
            failed += 1
            notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if not err <= tol:
            wrong += 1
            notes.append(f"{name}: wrong (rel err {err:.3g})")
            continue

        cand = Cand(name, variant.name, params, run, err)
        cands.append(cand)
        best = min((cd.quick_us for cd in cands), default=math.inf)
        once = _one_call_us(run)
        if once > PRUNE * best:
            cand.quick_us = once
            pruned += 1
            continue
        cand.quick_us = common.time_us(run, warmup_ms=1, budget_ms=5)["median_us"]
    for note in notes:
        print(f"  [{row.config} b{row.batch} {row.layer}] {note}", file=sys.stderr)
    out: dict[str, Any] = {"config": row.config, "layer": row.layer, "batch": row.batch}
    cands.sort(key=lambda cd: cd.quick_us)
    finals = cands[:FINALISTS]
    dflt = next((cd for cd in cands if cd.label == default_label), None)
    if dflt is not None and dflt not in finals:
        finals.append(dflt)
    cudnn_rounds: list[float] = []
    for _ in range(ROUNDS):  # interleaved, so drift hits everyone alike
        cudnn_rounds.append(common.time_us(torch_fn, warmup_ms=2, budget_ms=12)["median_us"])
        for cd in finals:
            cd.rounds.append(common.time_us(cd.fn, warmup_ms=2, budget_ms=12)["median_us"])
    cudnn = statistics.median(cudnn_rounds)
    flops = op.flops(problem)
    top = min(finals, key=lambda cd: cd.us) if finals else None
    if top is None:
        out.update(best="(none)", ours_us=math.nan, cudnn_us=cudnn, ratio=math.nan)
    else:
        out.update(best=top.label, ours_us=top.us, cudnn_us=cudnn, ratio=cudnn / top.us,
                   ours_tflops=flops / top.us / 1e6, cudnn_tflops=flops / cudnn / 1e6)
    if dflt is not None:
        out.update(default=default_label, default_us=dflt.us, default_ratio=cudnn / dflt.us)
    else:
        out.update(default=default_label + " (failed/wrong!)", default_us=math.nan,
                   default_ratio=math.nan)
    out.update(err_vs_torch=top.err if top is not None else math.nan,
               tried=len(cands) + wrong + failed, wrong=wrong, failed=failed, pruned=pruned)
    return out


# ----------------------------------------------------------------------------- section


def run(ctx: Any, quick: bool, batches: Sequence[int] = (1, 32, 256),
        configs: Sequence[tuple[str, str]] = CONFIGS) -> list[dict[str, Any]]:
    import cupy as cp
    import torch

    t0 = time.time()
    torch.backends.cudnn.benchmark = True
    tf32 = os.environ.get("DNNCTL_BENCH_TF32", "1") != "0"
    torch.backends.cudnn.allow_tf32 = tf32
    rows = plan_rows(quick, tf32, batches, configs)
    dev = common.backend().device(cp.cuda.Device().id)
    print(f"  {common.precompile(record_jobs, (list(rows), dev), PRECOMPILE_S)}", flush=True)
    out: list[dict[str, Any]] = []
    skipped: list[Row] = []
    for row in rows:
        if time.time() - t0 > BUDGET_S:
            skipped.append(row)
            continue
        try:
            out.append(bench_row(row))
        except Exception as exc:  # keep the section going; record the miss
            out.append({"config": row.config, "layer": row.layer, "batch": row.batch,
                        "best": f"error: {type(exc).__name__}: {exc}"[:160]})
        print(_progress(out[-1]), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    out.sort(key=lambda r: (CONFIGS.index(_config_tuple(r)) if _config_tuple(r) in CONFIGS
                            else 9, r["batch"]))
    if skipped:
        groups: dict[str, int] = {}
        for row in skipped:
            groups[f"{row.config} b{row.batch}"] = groups.get(f"{row.config} b{row.batch}",
                                                              0) + 1
        out.append({"config": "skipped (time budget)", "layer": f"{len(skipped)} rows",
                    "best": ", ".join(f"{k}: {v}" for k, v in groups.items())})
    return out


def _config_tuple(r: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(r.get("config", "")).split(" ", 1))


def _progress(row: Mapping[str, Any]) -> str:
    us = {k: row.get(k, math.nan) for k in ("ours_us", "default_us", "cudnn_us")}
    return (f"  {row.get('config')} b{row.get('batch')} {row.get('layer')}: "
            f"{row.get('best')} {us['ours_us']:.1f} us, default {us['default_us']:.1f} us, "
            f"cuDNN {us['cudnn_us']:.1f} us")


def summary(rows: list[dict[str, Any]], ctx: Any) -> str:
    """Geometric-mean speed ratios (cuDNN time / ours; > 1 means ours is faster), wins, and
    how the default heuristic (no plan) fares."""
    lines = ["- shapes: ResNet-50 v1.5 (torchvision) 23 distinct convolutions (v1 has 20) + "
             "MobileNetV2 10 distinct depthwise 3x3, batch 1 / 32 / 256, fp16 NHWC and fp32 "
             "NCHW (TF32 allowed on both sides unless DNNCTL_BENCH_TF32=0)"]
    timed = [r for r in rows if isinstance(r.get("ratio"), float) and r["ratio"] > 0]
    groups: dict[str, list[dict[str, Any]]] = {"all": timed}
    for r in timed:
        groups.setdefault(r["config"], []).append(r)
        groups.setdefault(f"{r['config']} batch {r['batch']}", []).append(r)
    for gname, rs in groups.items():
        wins = sum(1 for r in rs if r["ratio"] >= 1.0)
        dr = [r["default_ratio"] for r in rs
              if isinstance(r.get("default_ratio"), float) and r["default_ratio"] > 0]
        best = common.geomean([r["ratio"] for r in rs])
        lines.append(f"- {gname}: best geomean ratio {best:.3f} over {len(rs)} shapes, ours "
                     f"fastest on {wins}; default heuristic geomean {common.geomean(dr):.3f}")
    near = [r for r in timed if isinstance(r.get("default_us"), float)
            and r["default_us"] <= 1.1 * r["ours_us"]]
    if timed:
        lines.append(f"- default heuristic within 10% of the best candidate on {len(near)}/"
                     f"{len(timed)} shapes")
    misses = [r for r in rows if r not in timed]
    if misses:
        lines.append(f"- not timed: {len(misses)} rows (errors / skipped: see the table)")
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--configs", default="fp16,fp32", help="fp16 (NHWC) and/or fp32 (NCHW)")
    args = ap.parse_args()
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    wanted = {"fp16": CONFIGS[0], "fp32": CONFIGS[1]}
    configs = tuple(wanted[c] for c in args.configs.split(",") if c in wanted)
    rows = run(None, args.quick, batches, configs)
    print(common.markdown(rows))
    print(summary(rows, None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
