"""Memory-bound ops: dnnctl's best variant vs PyTorch on the same tensors, GB/s vs copy.

For each case every CUDA variant that supports the problem runs a small parameter sweep (the
heuristic's default plus a fixed-seed sample of its space); each candidate's output is
checked against torch's (a wrong kernel cannot win), timed briefly, and the fastest is
re-timed with the full budget next to torch. GB/s counts the op's minimum bytes (each input
read once, each output written once) over the median time; "% copy" compares with the
device-to-device copy measured in this run. Columns: best variant, its time and GB/s, the
heuristic's (no plan) time, torch's time and GB/s, torch / dnnctl (> 1: dnnctl faster).

    PYTHONPATH=. python3 benchmarks/run.py --only memory [--quick]
    PYTHONPATH=. python3 benchmarks/bench_memory.py [--quick]
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "Memory-bound ops: dnnctl (best variant) vs PyTorch, fp16 unless noted"
BUDGET_S = 120.0  # timing loop (after the parallel compile warm-up)
SWEEP = 8  # most parameter sets per variant (plus the heuristic's)

# (label, op, key, torch reference: (F, torch, tensors) -> output)
Case = tuple[str, str, dict[str, Any], Callable[..., Any]]


def _nchw(t: Any) -> Any:
    """An NHWC tensor seen as NCHW channels_last (what torch's NHWC kernels take)."""
    return t.permute(0, 3, 1, 2)


def cases(quick: bool) -> list[Case]:
    big = (8192, 8192)
    out: list[Case] = [
        ("relu 8192x8192", "activation", dict(fn="relu", shape=big, dtype="float16"),
         lambda F, torch, t: F.relu(t["x"])),
        ("gelu 8192x8192", "activation", dict(fn="gelu", shape=big, dtype="float16"),
         lambda F, torch, t: F.gelu(t["x"])),
        ("silu+bias NHWC 32x56x56x256", "activation",
         dict(fn="silu", shape=(32, 56, 56, 256), dtype="float16", bias="channel",
              layout="NHWC"),
         lambda F, torch, t: F.silu(t["x"] + t["bias"])),
        ("softmax 8192x8192", "softmax", dict(rows=8192, cols=8192, dtype="float16"),
         lambda F, torch, t: torch.softmax(t["x"], -1)),
        ("softmax 4x262144 fp32", "softmax", dict(rows=4, cols=262144, dtype="float32"),
         lambda F, torch, t: torch.softmax(t["x"], -1)),
        ("log_softmax 32768x1000", "softmax",
         dict(rows=32768, cols=1000, dtype="float16", log=True),
         lambda F, torch, t: torch.log_softmax(t["x"], -1)),
        ("layer_norm 8192x8192", "layer_norm", dict(rows=8192, cols=8192, dtype="float16"),
         lambda F, torch, t: F.layer_norm(t["x"], (8192,), t["weight"], t["bias"])),
        ("layer_norm 16384x768", "layer_norm", dict(rows=16384, cols=768, dtype="float16"),
         lambda F, torch, t: F.layer_norm(t["x"], (768,), t["weight"], t["bias"])),
        ("rms_norm 8192x8192", "rms_norm", dict(rows=8192, cols=8192, dtype="float16"),
         lambda F, torch, t: F.rms_norm(t["x"], (8192,), t["weight"], eps=1e-6)),
        ("batch_norm infer NHWC 32x56x56x256", "batch_norm",
         dict(n=32, c=256, h=56, w=56, dtype="float16", layout="NHWC"), _bn_infer),
        ("batch_norm infer NHWC 256x56x56x64", "batch_norm",
         dict(n=256, c=64, h=56, w=56, dtype="float16", layout="NHWC"), _bn_infer),
        ("batch_norm infer NCHW 32x256x56x56", "batch_norm",
         dict(n=32, c=256, h=56, w=56, dtype="float16", layout="NCHW"),
         lambda F, torch, t: F.batch_norm(t["x"], t["running_mean"], t["running_var"],
                                          t["weight"], t["bias"], training=False)),
        ("batch_norm train NHWC 32x56x56x256", "batch_norm",
         dict(n=32, c=256, h=56, w=56, dtype="float16", layout="NHWC", training=True),
         _bn_train),
        ("group_norm NHWC 32x56x56x256 g32", "group_norm",
         dict(n=32, c=256, h=56, w=56, groups=32, dtype="float16", layout="NHWC"),
         lambda F, torch, t: F.group_norm(_nchw(t["x"]), 32, t["weight"].half(),
                                          t["bias"].half())),
        ("max_pool 3x3/2 NHWC 256x112x112x64", "pool2d",
         dict(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2, pad=1,
              dtype="float16", layout="NHWC"),
         lambda F, torch, t: F.max_pool2d(_nchw(t["x"]), 3, 2, 1)),
        ("avg_pool 3x3/2 NHWC 256x112x112x64", "pool2d",
         dict(n=256, c=64, h=112, w=112, mode="avg", kernel=3, stride=2, pad=1,
              dtype="float16", layout="NHWC"),
         lambda F, torch, t: F.avg_pool2d(_nchw(t["x"]), 3, 2, 1)),
        ("global_avg_pool NHWC 256x7x7x2048", "global_avg_pool2d",
         dict(n=256, c=2048, h=7, w=7, dtype="float16", layout="NHWC"),
         lambda F, torch, t: F.adaptive_avg_pool2d(_nchw(t["x"]), 1)),
    ]
    if quick:
        keep = ("relu 8192", "softmax 8192", "layer_norm 8192", "batch_norm infer NHWC 32",
                "max_pool")
        out = [c for c in out if c[0].startswith(keep)]
    return out


def _bn_infer(F: Any, torch: Any, t: Mapping[str, Any]) -> Any:
    return F.batch_norm(_nchw(t["x"]), t["running_mean"], t["running_var"], t["weight"],
                        t["bias"], training=False)


def _bn_train(F: Any, torch: Any, t: Mapping[str, Any]) -> Any:
    return F.batch_norm(_nchw(t["x"]), t["running_mean"].clone(), t["running_var"].clone(),
                        t["weight"], t["bias"], training=True)


# ----------------------------------------------------------------------------- candidates


def candidates(op: Any, problem: Any, dev: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The heuristic's choice plus, per variant, its parameter sets with the widest vector
    (narrower ones are the misaligned fallbacks): all of them, or a fixed-seed sample of
    SWEEP when there are more."""
    from dnnctl.ops.registry import variants

    default = op.default_choice(problem, "cupy", dev)
    out = []
    for v in variants(problem.op, "cupy"):
        if not v.supports(problem, dev):
            continue
        space = list(v.param_space(problem, dev))
        widest = max((p.get("vec", 0) for p in space), default=0)
        top = [p for p in space if p.get("vec", 0) == widest]
        picks = [default.param_dict] if default.variant == v.name else []
        picks += top if len(top) <= SWEEP else random.Random(
            f"{problem.short()}{v.name}").sample(top, SWEEP)
        for p in picks:
            if (v, p) not in out:
                out.append((v, p))
    return out


def warm_kernel_cache(plan: list[tuple[Any, Any, list]], dev: Any) -> float:
    """Compile every candidate's module in parallel processes (CuPy's disk cache)."""
    from dnnctl.ops.precompile import compile_jobs, record_builds

    t0 = time.time()
    jobs = record_builds(((v, problem, p) for _, problem, cands in plan for v, p in cands), dev)
    try:
        compile_jobs(jobs)
    except Exception as exc:
        print(f"[memory bench: compile warm-up skipped: {exc}]", flush=True)
    return time.time() - t0


# ----------------------------------------------------------------------------- run


def _rel_err(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    fin = a.isfinite() & b.isfinite()
    if not bool(fin.all()):
        return float("inf")
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def run(ctx: common.Ctx, quick: bool) -> list[dict[str, Any]]:
    import cupy as cp
    import numpy as np
    import torch
    import torch.nn.functional as F

    from dnnctl.backends.registry import get_backend
    from dnnctl.ops.base import np_dtype
    from dnnctl.ops.registry import get_op

    be = get_backend("cupy")
    dev = be.device(cp.cuda.Device().id)
    plan = []
    for label, op_name, key, ref in cases(quick):
        op = get_op(op_name)
        problem = op.problem(key)
        plan.append(((label, op, ref), problem, candidates(op, problem, dev)))
    warm_s = warm_kernel_cache(plan, dev)
    print(f"[memory bench: {sum(len(c) for _, _, c in plan)} candidates compiled in "
          f"{warm_s:.0f} s]", flush=True)
    t_start = time.time()
    rows = []
    rng = np.random.default_rng(0)
    for (label, op, ref), problem, cands in plan:
        if time.time() - t_start > BUDGET_S:
            rows.append({"case": label, "best variant": "(skipped: time budget)"})
            continue
        host = op.make_inputs(problem, rng)
        ins = {k: be.asarray(v) for k, v in host.items()}
        outs = {k: cp.empty(s.shape, dtype=np_dtype(s.dtype))
                for k, s in op.output_specs(problem).items()}
        attrs = op.default_attrs(problem)
        tt = {k: torch.from_dlpack(v) for k, v in ins.items()}
        try:
            want = ref(F, torch, tt)
            t_torch = common.time_us(lambda tt=tt, ref=ref: ref(F, torch, tt),
                                     warmup_ms=10, budget_ms=80)["median_us"]
        except Exception as exc:
            want, t_torch = None, float("nan")
            print(f"[{label}: torch failed: {exc}]", flush=True)
        tol = 3 * op.tolerance(problem, "y") + 1e-4
        results = []
        default = op.default_choice(problem, "cupy", dev)
        t_default = float("nan")
        for v, p in cands:
            try:
                kern = v.build(problem, p, dev)
                kern(ins, outs, attrs)
                cp.cuda.get_current_stream().synchronize()
                y = torch.from_dlpack(outs["y"])
                if problem.get("layout") == "NHWC" and problem.op != "activation":
                    y = _nchw(y)  # torch's result is the NCHW (channels_last) view
                if want is not None:
                    err = _rel_err(y, want)
                    if not err <= tol:
                        print(f"[{label}: {v.name}{p} disagrees with torch: {err:.3g}]")
                        continue
                t = common.time_us(lambda k=kern, i=ins, o=outs, a=attrs: k(i, o, a),
                                   warmup_ms=4, budget_ms=15)["median_us"]
            except Exception as exc:
                print(f"[{label}: {v.name}{p} failed: {type(exc).__name__}: {exc}]")
                continue
            results.append((t, v, p))
            if v.name == default.variant and p == default.param_dict:
                t_default = t
        if not results:
            rows.append({"case": label, "best variant": "(no candidate ran)"})
            continue
        results.sort(key=lambda r: r[0])
        _, v, p = results[0]
        kern = v.build(problem, p, dev)
        t_best = common.time_us(lambda k=kern, i=ins, o=outs, a=attrs: k(i, o, a),
                                warmup_ms=10, budget_ms=80)["median_us"]
        nbytes = op.min_bytes(problem)
        gbps = nbytes / t_best / 1e3
        rows.append({
            "case": label,
            "best variant": f"{v.name}({','.join(f'{k}={x}' for k, x in p.items())})",
            "dnnctl us": t_best,
            "GB/s": gbps,
            "% copy": 100.0 * gbps / ctx.copy_gbps,
            "heuristic us": t_default,
            "torch us": t_torch,
            "torch GB/s": nbytes / t_torch / 1e3 if t_torch == t_torch else float("nan"),
            "torch/dnnctl": t_torch / t_best if t_torch == t_torch else float("nan"),
            "tried": len(results),
        })
        print(rows[-1], flush=True)
        del ins, outs, tt, want
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def summary(rows: list[dict[str, Any]], ctx: common.Ctx) -> str:
    done = [r for r in rows if "GB/s" in r]
    if not done:
        return "(no results)"
    ratios = [r["torch/dnnctl"] for r in done if r["torch/dnnctl"] == r["torch/dnnctl"]]
    under = [r["case"] for r in done if r["% copy"] < 85.0]
    slower = [r["case"] for r in done if r["torch/dnnctl"] == r["torch/dnnctl"]
              and r["torch/dnnctl"] < 1.0]
    lines = [f"Geomean torch/dnnctl: {common.geomean(ratios):.2f}x over {len(ratios)} cases.",
             f"Below 85% of copy bandwidth ({ctx.copy_gbps:.0f} GB/s): "
             + (", ".join(under) if under else "none") + ".",
             "Slower than torch: " + (", ".join(slower) if slower else "none") + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    c = common.measure_ceilings()
    print(c.header())
    res = run(c, args.quick)
    print(common.markdown(res))
    print(summary(res, c))
