"""dnnctl tune: is the plan's choice really the fastest, what does it buy over the default
heuristics, what does a planned call cost, and how long does tuning take?

For subsets of ResNet-50 (batch 32, fp16 NHWC) and BERT-base (batch 8, sequence 128, fp16)
the tuner runs as ``dnnctl tune`` does (worker subprocesses, build helpers, verification,
CUDA-event timing with L2 flush, interleaved re-timing of the leaders, tie-breaking), with a
random sample of K candidates per problem (the default heuristic always among them) and a
time budget. Then this process re-measures EVERY candidate that passed verification, in
interleaved rounds with many samples each, and reports per problem:

* ``within_3pct``: the plan's choice is within 3% of the re-measured best (goal: >= 95%);
* ``vs_default``: re-measured time of the default heuristic's choice / the plan's choice;
* the tuning time per workload subset (summary).

Dispatch overhead: a planned ``dnnctl.ops`` call (public function, plan lookup, cached
kernel, output allocation) against calling the same built kernel directly with a freshly
allocated output (goal <= 5 us), and that against the bare CuPy launches of the same kernel,
on small problems whose GPU time is below the launch cost; wall clock per call over
thousands of calls, best of several repeats.

    PYTHONPATH=. python3 benchmarks/run.py --only tune [--quick]
    PYTHONPATH=. python3 benchmarks/bench_tune.py [--quick]

The decision-quality check on ONE WHOLE bundled workload (every problem of it tuned with up
to --evals random candidates, the default heuristic always among them, then every candidate
that passed verification re-measured; no dispatch probes), e.g. ResNet-50 at batch 32:

    PYTHONPATH=. python3 benchmarks/bench_tune.py --workload resnet50 --batch 32 \
        [--evals 10] [--budget 110]
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "tune: plan choice vs re-measured best, speed-up over the default heuristics"
_NOTES: list[str] = []
# the device the tuning sections run on; DNNCTL_BENCH_TUNE_DEVICE=cpu dry-runs the logic
DEVICE = os.environ.get("DNNCTL_BENCH_TUNE_DEVICE", "cuda:0")


def _subsets(quick: bool) -> list[tuple[str, Any]]:
    from dnnctl.workloads import Workload, build

    rn = build("resnet50", batch=32)

    def conv(c: int, k: int, h: int, r: int, residual: bool = False) -> Any:
        return next(it for it in rn.items if it.problem.op == "conv2d" and (
            it.problem["c"], it.problem["k"], it.problem["h"], it.problem["r"],
            it.problem["residual"]) == (c, k, h, r, residual))

    # stem 7x7/2, stage-1 3x3, stage-1 1x1 (+residual), stage-2 strided 3x3, stage-3 1x1
    # (+residual), stage-4 3x3; then the classifier GEMM and the max pool
    picks = [conv(3, 64, 224, 7), conv(64, 64, 56, 3), conv(64, 256, 56, 1, residual=True),
             conv(128, 128, 56, 3), conv(256, 1024, 14, 1, residual=True), conv(512, 512, 7, 3)]
    extra = [it for it in rn.items if it.problem.op in ("matmul", "pool2d")]
    rn_items = (picks[1:4] + extra[-1:]) if quick else picks + extra
    bert = build("bert_base", batch=8, seq=128)
    bert_items = bert.items[:4] if quick else bert.items
    out = []
    for name, items in (("resnet50 b32", rn_items), ("bert_base b8 s128", bert_items)):
        wl = Workload(name)
        for it in items:
            wl.add(it.problem, count=it.count)
        out.append((name, wl))
    return out


def _remeasure(problem: Any, cands: list[Any], rounds: int, budget_ms: float
               ) -> dict[Any, float]:
    """Median over interleaved rounds of each candidate's per-round median time (us), each
    called as the tuner's worker calls it (common.candidate_call)."""
    import numpy as np

    from dnnctl.backends.registry import get_backend, parse_device
    from dnnctl.ops.base import np_dtype
    from dnnctl.ops.check import prepare
    from dnnctl.ops.registry import get_op, get_variant

    backend, index = parse_device(DEVICE)
    be = get_backend(backend)
    be.use_device(index)
    dev = be.device(index)
    op = get_op(problem.op)
    prep = prepare(op, problem, be, np.random.default_rng(1), with_reference=False)
    with contextlib.ExitStack() as stack:
        runs = []
        for c in cands:
            variant = get_variant(problem.op, backend, c.variant)
            try:
                kern = variant.build(problem, c.param_dict, dev)
            except Exception as exc:  # noqa: BLE001 - reported, never fatal
                _NOTES.append(f"rebuild failed for {problem.short()} {c.label()}: {exc}")
                continue
            inputs = {k: be.xp.array(v, copy=True) for k, v in prep.inputs.items()}
            outputs = {n: be.empty(s.shape, np_dtype(s.dtype)) for n, s in
                       op.output_specs(problem).items()}
            call, _ = common.candidate_call(stack, variant, kern, inputs, outputs,
                                            prep.attrs)
            runs.append((c, call))
        meds: dict[Any, list[float]] = {c: [] for c, _ in runs}
        for r in range(rounds):
            k = r % max(1, len(runs))
            for c, call in runs[k:] + runs[:k]:
                s = be.time(call, warmup_ms=3.0, budget_ms=budget_ms, flush_l2=True)
                meds[c].append(float(np.median(s)))
    return {c: statistics.median(v) for c, v in meds.items() if v}


def whole(workload: str, batch: int | None = None) -> list[tuple[str, Any]]:
    """Every problem of one bundled workload (with its counts), as one subset."""
    from dnnctl.workloads import build

    wl = build(workload, batch=batch)
    name = workload + (f" b{batch}" if batch else "")
    return [(name, wl)]


def _tune_subset(name: str, wl: Any, quick: bool, evals: int | None = None,
                 budget_s: float | None = None) -> list[dict[str, Any]]:
    from dnnctl.cli.render import short_problem
    from dnnctl.plan import read_plan
    from dnnctl.tune.candidates import Candidate
    from dnnctl.tune.journal import problem_id, read_journal
    from dnnctl.tune.tuner import TuneOptions, tune

    k = evals or (6 if quick else 12)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tune_"))
    out = tmp / "plan.yaml"
    t0 = time.perf_counter()
    report = tune(wl, TuneOptions(device=DEVICE, output=out, strategy="random", max_evals=k,
                                  budget_s=budget_s or (45.0 if quick else 120.0),
                                  keep_journal=True,
                                  candidate_timeout_s=300.0))
    tune_s = time.perf_counter() - t0
    _NOTES.append(f"{name}: tuned {len(wl.items)} problems, "
                  f"{sum(o.tried for o in report.outcomes)} candidates in {tune_s:.0f} s "
                  f"({report.prebuilt} compiled ahead by build helpers)")
    state = read_journal(report.journal_path)
    section = read_plan(out).sections[0]
    rows = []
    for it in wl.items:
        o = next(o for o in report.outcomes if o.problem == it.problem)
        row: dict[str, Any] = {"workload": name, "problem": short_problem(it.problem),
                               "count": it.count, "status": o.status, "tried": o.tried,
                               "failed": sum(o.failed.values()), "tune_s": round(tune_s, 1)}
        entry = section.find(it.problem)
        log = state.problems.get(problem_id(it.problem))
        if entry is None or log is None:
            rows.append(row)
            continue
        ok = [c for c, r in log.results.items() if r.ok]
        truth = _remeasure(it.problem, ok, 3 if quick else 5, 10.0 if quick else 20.0)
        choice = Candidate.from_choice(entry.choice)
        default = None if entry.default is None else Candidate.from_choice(entry.default.choice)
        best_c = min(truth, key=truth.get)
        t_choice, t_best = truth.get(choice), truth[best_c]
        t_default = truth.get(default) if default is not None else None
        row.update({
            "choice": entry.choice.label()[:60], "plan_us": entry.stats.median_us,
            "true_us": t_choice, "best": best_c.label()[:60], "best_us": t_best,
            "ratio": (t_choice / t_best) if t_choice else None,
            "within_3pct": bool(t_choice and t_choice <= 1.03 * t_best),
            "default_us": t_default,
            "vs_default": (t_default / t_choice) if t_default and t_choice else None,
        })
        rows.append(row)
    return rows


def _dispatch_overhead(quick: bool) -> list[str]:
    """Per call wall clock (us) of one small problem per probe, four ways:

    * bare: ``cp.empty`` for the output + the chosen kernel's launches as a hand-written CuPy
      program makes them (``RawKernel(grid, block, args, shared_mem=)``, NumPy scalars);
    * kernel: our built kernel object called directly (``kern(inputs, {"y": cp.empty()})``);
    * planned: the public ``dnnctl.ops`` call with ``plan=`` (signature lookup, plan lookup,
      output allocation, launch); goal: planned - kernel <= 5 us;
    * unplanned: the same call without a plan (default heuristic).
    """
    import cupy as cp
    import numpy as np

    import dnnctl
    from dnnctl.backends.registry import get_backend
    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops import dispatch, registry
    from dnnctl.tune.tuner import TuneOptions, tune
    from dnnctl.workloads import Workload

    probes = [("softmax", {"rows": 64, "cols": 128, "dtype": "float16", "log": False}),
              ("layer_norm", {"rows": 64, "cols": 768, "dtype": "float16"}),
              ("matmul", {"m": 64, "n": 64, "k": 64, "dtype": "float16", "bias": False,
                          "activation": "none"})]
    calls = {
        "softmax": lambda a, **kw: dnnctl.ops.softmax(a["x"], **kw),
        "layer_norm": lambda a, **kw: dnnctl.ops.layer_norm(a["x"], a["weight"], a["bias"],
                                                            **kw),
        "matmul": lambda a, **kw: dnnctl.ops.matmul(a["a"], a["b"], **kw),
    }
    wl = Workload("dispatch-probe")
    for op, key in probes:
        wl.add(op, key)
    out = Path(tempfile.mkdtemp(prefix="bench_dispatch_")) / "plan.yaml"
    tune(wl, TuneOptions(device="cuda:0", output=out, strategy="random", max_evals=4))
    plan = dnnctl.load_plan(str(out), strict=True, device="cuda:0")
    be = get_backend("cupy")
    dev = be.device(0)
    rng = np.random.default_rng(0)
    n, reps = (2000, 3) if quick else (5000, 5)
    stream = cp.cuda.get_current_stream()
    lines = []
    for op_name, key in probes:
        op = registry.get_op(op_name)
        problem = dispatch.problem_of(op, key)
        arrs = {k: cp.asarray(v) for k, v in op.make_inputs(problem, rng).items()}
        call = calls[op_name]
        choice = plan.lookup(problem, "cupy", dev)
        kern = dispatch.kernel_for(problem, be, dev, choice)
        spec = op.output_specs(problem)["y"]
        shape, dtype = tuple(spec.shape), dispatch.np_dtype(spec.dtype)
        attrs = op.default_attrs(problem)

        def direct(a=arrs, k=kern, s=shape, dt=dtype, at=attrs):
            k(a, {"y": cp.empty(s, dtype=dt)}, at)

        with mc.traced_launches() as launches:  # what the kernel object launches, replayed
            direct()
        stream.synchronize()

        def bare(ls=tuple(launches), s=shape, dt=dtype):
            cp.empty(s, dtype=dt)
            for fn, grid, block, args, smem in ls:
                fn(grid, block, args, shared_mem=smem)

        fns = {"kernel": direct,
               "planned": functools.partial(call, arrs, plan=plan),
               "unplanned": functools.partial(call, arrs)}
        if launches:
            fns["bare"] = bare
        res = {}
        for label, fn in fns.items():
            for _ in range(100):
                fn()
            stream.synchronize()
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                stream.synchronize()
                best = min(best, (time.perf_counter() - t0) / n * 1e6)
            res[label] = best
        bare_text = (f"bare CuPy launch {res['bare']:.2f} us ({len(launches)} launch"
                     f"{'es' if len(launches) > 1 else ''}), kernel object "
                     f"{res['kernel']:.2f} us (+{res['kernel'] - res['bare']:.2f})"
                     if "bare" in res else
                     f"kernel object {res['kernel']:.2f} us (no RawKernel launch to replay)")
        lines.append(f"dispatch overhead {op_name} {problem.short()[:60]}: {bare_text}, planned "
                     f"call {res['planned']:.2f} us -> overhead over the kernel object "
                     f"{res['planned'] - res['kernel']:.2f} us (goal <= 5); unplanned "
                     f"{res['unplanned']:.2f} us; choice {choice.label() if choice else None}")
    return lines


def run(ctx: Any, quick: bool) -> list[dict[str, Any]]:
    _NOTES.clear()
    rows: list[dict[str, Any]] = []
    for name, wl in _subsets(quick):
        rows.extend(_tune_subset(name, wl, quick))
    try:
        _NOTES.extend(_dispatch_overhead(quick))
    except Exception as exc:  # noqa: BLE001 - the tables above still count
        _NOTES.append(f"dispatch overhead: failed: {type(exc).__name__}: {exc}")
    return rows


def summary(rows: list[dict[str, Any]], ctx: Any) -> str:
    judged = [r for r in rows if "within_3pct" in r]
    lines = []
    if judged:
        hit = sum(1 for r in judged if r["within_3pct"])
        lines.append(f"plan choice within 3% of the re-measured best: {hit}/{len(judged)} "
                     f"({100.0 * hit / len(judged):.0f}%; goal >= 95%)")
        exact = sum(1 for r in judged if r["choice"] == r["best"])
        lines.append(f"plan choice is the re-measured best: {exact}/{len(judged)}")
        sp = [r["vs_default"] for r in judged if r.get("vs_default")]
        lines.append(f"speed-up of the planned choice over the default heuristic: geomean "
                     f"{common.geomean(sp):.3f}x, best {max(sp, default=0):.2f}x, worst "
                     f"{min(sp, default=0):.2f}x")
        for wl in dict.fromkeys(r["workload"] for r in judged):
            sub = [r for r in judged if r["workload"] == wl and r.get("default_us")]
            t_def = sum(r["count"] * r["default_us"] for r in sub)
            t_plan = sum(r["count"] * r["true_us"] for r in sub)
            if t_plan:
                lines.append(f"{wl}: count-weighted time of the subset, default heuristics "
                             f"{t_def:.0f} us vs plan {t_plan:.0f} us ({t_def / t_plan:.3f}x)")
    unplanned = [r for r in rows if r.get("status") == "unplanned"]
    if unplanned:
        lines.append(f"UNPLANNED problems: {len(unplanned)}")
    lines.extend(_NOTES)
    return "\n".join(f"- {line}" for line in lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the 8-problem sample")
    ap.add_argument("--workload", help="tune and judge this whole bundled workload instead")
    ap.add_argument("--batch", type=int, help="the workload's batch option")
    ap.add_argument("--evals", type=int, help="candidates per problem (default 12, quick 6)")
    ap.add_argument("--budget", type=float, help="tuning seconds (default 120, quick 45)")
    args = ap.parse_args(argv)
    if args.workload:
        _NOTES.clear()
        result = []
        for name, wl in whole(args.workload, args.batch):
            result.extend(_tune_subset(name, wl, args.quick, args.evals, args.budget))
    else:
        result = run(None, args.quick)
    print(common.markdown(result))
    print(summary(result, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
