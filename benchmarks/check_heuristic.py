"""Offline check of the default heuristic's cost model against logged H200 timings (no GPU).

Reads the per-shape rows of a bench_conv log (benchmarks/logs/2026-12-02-round2-conv.md: for
every shape the best candidate with its time, the then-default candidate with its time, and
cuDNN) and, for each shape, asks today's default heuristic (the cost model) what it would run
on an H200. The log holds the times of two candidates per shape only, so a pick is judged:

* **hit**: the pick is the logged best candidate (same variant and parameters);
* **within**: the pick is the logged default candidate and that was within 10% of the best;
* **miss**: the pick is the logged default candidate and that was more than 10% slower;
* **unknown**: the pick is neither (its time was not logged) - counted separately, never as
  a hit. ``same variant`` counts unknown picks whose variant is the best candidate's.

It also reports how the model orders the two logged candidates where they differ by more
than 10% (pairwise order agreement), and the model's estimate vs the measured time of every
logged candidate (calibration: the median and spread of estimate / measured).

This is an IN-SAMPLE check: the model's throughput constants were read from these same logs.
The out-of-sample check is benchmarks/bench_unseen.py on the GPU. A bench_unseen JSON that
kept every timed candidate (logs/2026-12-04-pm-unseen-candidates.json, 8 per problem) is
checked too: today's pick against the fastest of them, where the pick was one of them.

    PYTHONPATH=. python3 benchmarks/check_heuristic.py [--log PATH] [--json OUT] [--rows]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_conv  # noqa: E402
import conv_candidates  # noqa: E402

from dnnctl.ops.conv2d.op import own_choice  # noqa: E402

LOG = Path(__file__).resolve().parent / "logs" / "2026-12-02-round2-conv.md"
GEMM_LOG = Path(__file__).resolve().parent / "logs" / "2026-12-02-round2-gemm.md"
UNSEEN_LOG = Path(__file__).resolve().parent / "logs" / "2026-12-04-pm-unseen-candidates.json"
WITHIN = 1.10
TC = re.compile(r"(\d+)x(\d+)x(\d+) w(\d+) s(\d+)")


@dataclass(frozen=True)
class Logged:
    """One logged shape: its key, the best and the then-default candidate with times."""

    config: str
    layer: str
    batch: int
    key: dict[str, Any]
    best: tuple[str, dict[str, Any]]
    best_us: float
    default: tuple[str, dict[str, Any]] | None
    default_us: float


def parse_label(label: str) -> tuple[str, dict[str, Any]]:
    """Inverse of conv_candidates.label: 'implicit_gemm(128x64x32 w4 s4 sk2)' ->
    ('implicit_gemm', {bm: 128, bn: 64, bk: 32, warps: 4, stages: 4, splitk: 2})."""
    name, _, rest = label.partition("(")
    rest = rest.rstrip(")").strip()
    params: dict[str, Any] = {}
    m = TC.match(rest)
    if m:
        params.update(zip(("bm", "bn", "bk", "warps", "stages"), map(int, m.groups())))
        params["splitk"] = 1
        rest = rest[m.end():]
    for tok in rest.split():
        if tok.startswith("sk") and tok[2:].isdigit():
            params["splitk"] = int(tok[2:])
        elif "=" in tok:
            k, v = tok.split("=", 1)
            params[k] = int(v) if v.lstrip("-").isdigit() else v
    return name.strip(), params


def _shapes() -> dict[str, dict[str, int]]:
    return dict(bench_conv.resnet50_layers() + bench_conv.mobilenet_v2_depthwise())


def read_log(path: Path = LOG) -> Iterator[Logged]:
    """The conv rows of a bench_conv log (markdown table; rows without times skipped)."""
    shapes = _shapes()
    cols: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "config":
            cols = cells
            continue
        if not cols or cells[0].startswith("---") or len(cells) != len(cols):
            continue
        row = dict(zip(cols, cells))
        if row["layer"] not in shapes or not row.get("ours_us"):
            continue
        dtype, layout = row["config"].split()
        r = bench_conv.Row(row["layer"], tuple(sorted(shapes[row["layer"]].items())),
                           int(row["batch"]), dtype, layout, True)
        try:
            dflt_us = float(row.get("default_us", "nan"))
        except ValueError:
            dflt_us = math.nan
        dflt = row.get("default", "")
        yield Logged(row["config"], row["layer"], int(row["batch"]), r.key(),
                     parse_label(row["best"]), float(row["ours_us"]),
                     parse_label(dflt) if dflt and "failed" not in dflt else None, dflt_us)


def h200() -> Any:
    from dnnctl.backends.base import DeviceInfo

    return DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                      sm_count=132, smem_per_block_optin=232448, l2_bytes=62914560)


def _estimate(problem: Any, cand: tuple[str, dict[str, Any]], dev: Any) -> float:
    from dnnctl.ops import costmodel as cm
    from dnnctl.ops.conv2d.cost import COSTS
    from dnnctl.ops.registry import get_variant

    fn = COSTS.get(cand[0])
    if fn is None:
        return math.nan
    variant = get_variant("conv2d", "cupy", cand[0])
    full = dict(cand[1])
    if set(variant.params) > set(full):  # labels omit nothing today; keep it robust
        from dnnctl.ops.conv2d.op import default_params

        full = {**(default_params(variant, problem, dev) or {}), **full}
    est = fn(variant, problem, full, cm.device_facts(dev))
    return est.us if est is not None else math.nan


def check(path: Path = LOG) -> dict[str, Any]:
    """Per-shape outcomes and the summary counts (see the module docstring)."""
    import dnnctl.ops  # noqa: F401 - registers the ops and variants
    from dnnctl.ops.registry import get_op

    op, dev = get_op("conv2d"), h200()
    rows, ratios, pairs_ok, pairs = [], [], 0, 0
    counts = dict(hit=0, within=0, miss=0, unknown=0, same_variant=0, pair_ties=0)
    for lg in read_log(path):
        problem = op.problem(lg.key)
        choice = own_choice(problem, "cupy", dev)
        pick = (choice.variant, choice.param_dict)
        if pick == lg.best:
            outcome = "hit"
        elif lg.default is not None and pick == lg.default and not math.isnan(lg.default_us):
            outcome = "within" if lg.default_us <= WITHIN * lg.best_us else "miss"
        else:
            outcome = "unknown"
            counts["same_variant"] += pick[0] == lg.best[0]
        counts[outcome] += 1
        est_best = _estimate(problem, lg.best, dev)
        ratios.append(est_best / lg.best_us)
        if lg.default is not None and not math.isnan(lg.default_us) and lg.default != lg.best:
            est_def = _estimate(problem, lg.default, dev)
            ratios.append(est_def / lg.default_us)
            if max(lg.default_us, lg.best_us) > WITHIN * min(lg.default_us, lg.best_us):
                if abs(est_best - est_def) <= 1e-9 * est_def:
                    counts["pair_ties"] += 1  # parameters the model does not see
                else:
                    pairs += 1
                    pairs_ok += (est_best < est_def) == (lg.best_us < lg.default_us)
        rows.append({"config": lg.config, "layer": lg.layer, "batch": lg.batch,
                     "pick": conv_candidates.label(*pick),
                     "best": conv_candidates.label(*lg.best), "best_us": lg.best_us,
                     "est_best_us": round(est_best, 2), "outcome": outcome})
    good = [r for r in ratios if r > 0 and not math.isnan(r)]
    logs = sorted(math.log(r) for r in good)
    return {"shapes": len(rows), **counts,
            "known": counts["hit"] + counts["within"] + counts["miss"],
            "pairs": pairs, "pairs_ordered": pairs_ok,
            "calibration_median": math.exp(statistics.median(logs)) if logs else math.nan,
            "calibration_p10": math.exp(logs[len(logs) // 10]) if logs else math.nan,
            "calibration_p90": math.exp(logs[9 * len(logs) // 10]) if logs else math.nan,
            "rows": rows}


def _table(path: Path) -> Iterator[dict[str, str]]:
    cols: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cols:
            cols = cells
        elif not cells[0].startswith("---") and len(cells) == len(cols):
            yield dict(zip(cols, cells))


def check_gemm(path: Path = GEMM_LOG) -> dict[str, Any]:
    """The matmul pick per logged GEMM, judged by variant: the log has the time of cuBLAS
    and of the best wgmma and mma candidates, so a pick of variant V counts as within 10%
    when V's logged time is within 10% of the fastest of the three (our pick's parameters
    may differ from the logged candidate's)."""
    import dnnctl.ops  # noqa: F401
    from dnnctl.ops.registry import get_op

    op, dev = get_op("matmul"), h200()
    rows, ok = [], 0
    for r in _table(path):
        times = {"cublas": float(r["torch_us"]), "wgmma": float(r["wgmma_us"]),
                 "mma": float(r["mma_us"])}
        p = op.problem(dict(m=int(r["m"]), n=int(r["n"]), k=int(r["k"]), dtype=r["dtype"]))
        pick = op.default_choice(p, "cupy", dev).variant
        t = times.get(pick, math.nan)
        good = t <= WITHIN * min(times.values())
        ok += good
        rows.append({"shape": r["shape"], "dtype": r["dtype"], "pick": pick,
                     "pick_us": t, "best_us": min(times.values()), "within": good})
    return {"shapes": len(rows), "within": ok, "rows": rows}


def summary(res: dict[str, Any]) -> str:
    n, known = res["shapes"], res["known"]
    ok = res["hit"] + res["within"]
    return "\n".join([
        f"in-sample check on {n} logged shapes (the constants came from these logs):",
        f"  pick = logged best: {res['hit']}; = logged default and within 10%: "
        f"{res['within']}; = logged default and slower: {res['miss']}",
        f"  pick within 10% of the best: {ok}/{n} shapes at least ({100 * ok / n:.0f}%); "
        f"{ok}/{known} of the {known} whose pick was timed",
        f"  pick not timed in the log: {res['unknown']} (its variant is the best's on "
        f"{res['same_variant']})",
        f"  order of the two logged candidates (>10% apart) right on {res['pairs_ordered']}"
        f"/{res['pairs']} (and estimated equal on {res['pair_ties']}: parameters the model "
        "does not score)",
        f"  estimate / measured over every logged candidate: median "
        f"{res['calibration_median']:.2f}, p10 {res['calibration_p10']:.2f}, "
        f"p90 {res['calibration_p90']:.2f}"])


def check_unseen(path: Path = UNSEEN_LOG) -> dict[str, Any]:
    """Today's default pick on each problem of a bench_unseen JSON that recorded every timed
    candidate (``--top-k 8``): the pick's time when it was one of them, against the fastest.
    The model's stage and im2col terms were read from the 2026-12-04 file: in-sample there,
    out-of-sample on any later run."""
    import bench_unseen
    import unseen_cases

    from dnnctl.ops.registry import get_op

    dev = h200()
    cases = {(c.config, c.name): c for c in unseen_cases.cases(False, "conv,gemm")}
    rows, within, timed = [], 0, 0
    for r in json.loads(path.read_text())["rows"]:
        case, cands = cases.get((r.get("config"), r.get("shape"))), r.get("candidates")
        if case is None or not cands:
            continue
        op = get_op(case.op)
        problem = op.problem(case.key_dict)
        choice = (own_choice(problem, "cupy", dev) if op.name == "conv2d"
                  else op.default_choice(problem, "cupy", dev))
        label = bench_unseen.candidate_label(choice.variant, dict(choice.param_dict))
        times = {c["candidate"]: c["us"] for c in cands}
        best, us = min(times.values()), times.get(label)
        if us is not None:
            timed += 1
            within += best / us >= 1 / 1.1
        rows.append({"config": r["config"], "shape": r["shape"], "pick": label, "pick_us": us,
                     "best_us": best})
    return {"problems": len(rows), "timed": timed, "within": within, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=LOG)
    ap.add_argument("--json", type=Path, help="write the per-shape outcomes here")
    ap.add_argument("--rows", action="store_true", help="print every shape's outcome")
    args = ap.parse_args(argv)
    res = check(args.log)
    gemm = check_gemm() if GEMM_LOG.exists() else None
    if args.rows:
        for r in res["rows"]:
            print(f"{r['outcome']:8} {r['config']:13} b{r['batch']:<4} {r['layer']:26} "
                  f"pick {r['pick']}  best {r['best']} {r['best_us']:.1f}us "
                  f"(est {r['est_best_us']})")
    print(summary(res))
    if gemm is not None:
        if args.rows:
            for r in gemm["rows"]:
                print(f"gemm {r['shape']:36} {r['dtype']:9} pick {r['pick']:7} "
                      f"{r['pick_us']:.1f}us best {r['best_us']:.1f}us")
        print(f"GEMM log: the picked variant within 10% of the fastest logged on "
              f"{gemm['within']}/{gemm['shapes']} shapes (judged by variant)")
        res["gemm"] = gemm
    if UNSEEN_LOG.exists():
        unseen = check_unseen()
        if args.rows:
            for r in unseen["rows"]:
                us = "not timed" if r["pick_us"] is None else f"{r['pick_us']:.1f}us"
                print(f"unseen {r['config']:13} {r['shape'][:34]:34} pick {r['pick']} {us} "
                      f"best {r['best_us']:.1f}us")
        print(f"unseen log (every candidate timed): pick within 10% of the fastest on "
              f"{unseen['within']}/{unseen['timed']} problems whose pick was timed "
              f"({unseen['problems']} problems)")
        res["unseen"] = unseen
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
