"""End to end: ResNet-50, ViT-B/16 and a LLaMA-7B layer, five ways, on one GPU.

Ways: ``eager``; ``compile`` (torch.compile default); ``compile-ro`` (mode="reduce-overhead",
CUDA graphs); ``dnnctl`` (dnnctl.torch.patch + plan, eager); ``dnnctl+graphs`` (the same
with ``graphs=True``: the patched forward replayed from a CUDA graph, no compile);
``dnnctl+compile-ro`` (patched,
then compiled with reduce-overhead); ``compile-ro+freeze`` and ``dnnctl+compile-ro+freeze``, the
same with ``torch._inductor.config.freezing = True`` (weights taken as constants at compile
time: torch folds its own conv + BN, and the patched model's conv + BN fold is computed once
instead of in every replay). Median milliseconds per forward from CUDA events after
warm-up, under torch.inference_mode(). Every non-eager output is compared with eager's
(max |diff| / max |eager|) and the dnnctl rows say what the patch covered and what fell back
to torch at run time. A failing row prints its error; the others go on.

    PYTHONPATH=. python3 benchmarks/bench_e2e.py [--quick] [--plan PLAN.yaml]
        [--record-workload DIR] [--models resnet50-b1,...] [--ways eager,dnnctl] [--out F.json]

Tune first: ``--record-workload wl/`` writes each model's recorded workload
(``wl/<config>.workload.yaml``); ``dnnctl tune wl/<config>.workload.yaml -o plan.yaml`` for
each (plans merge into one file); then ``--plan plan.yaml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _torch_bench as tb  # noqa: E402
import models  # noqa: E402

TITLE = "End to end: eager / torch.compile / dnnctl patch, median ms per forward"
WAYS = ("eager", "compile", "compile-ro", "dnnctl", "dnnctl+graphs", "dnnctl+compile-ro",
        "compile-ro+freeze", "dnnctl+compile-ro+freeze")
QUICK = {"llama7b-decode-b8-kv2048": WAYS, "resnet50-b1": ("eager", "dnnctl", "dnnctl+graphs")}
TOLERANCE = 3e-2  # max |diff| / max |eager| for fp16 / bf16 models


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _forward(way: str, model: Any, inputs: tuple, plan: Any,
             notes: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(a zero-argument forward for ``way``, its cleanup)."""
    import torch

    import dnnctl.torch as dt

    torch._dynamo.reset()
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    target = model
    if way.startswith("dnnctl"):
        from dnnctl.backends import replay

        # the replayer loads in the background (seconds; a first build ~30 s): the rows
        # time the steady state, not the calls before it is there
        replay.module(wait=120.0)
        report = dt.patch(model, plan, graphs=way == "dnnctl+graphs")
        notes["report"] = report
        cleanup = lambda: dt.unpatch(model)  # noqa: E731
    if "compile" in way:
        mode = "reduce-overhead" if "-ro" in way else None
        if way.endswith("+freeze"):
            # read when the first calls compile: kept on for the whole row
            from torch._inductor import config as inductor_config

            saved, undo = inductor_config.freezing, cleanup
            inductor_config.freezing = True

            def cleanup() -> None:
                inductor_config.freezing = saved
                undo()
        target = torch.compile(model, mode=mode)
    return (lambda: target(*inputs)), cleanup


def _via_torch() -> int:
    """Calls so far whose vendor GEMM ran as torch's own F.linear (dnnctl.torch.kernels)."""
    from dnnctl.torch.kernels import VENDOR_VIA_TORCH

    return sum(VENDOR_VIA_TORCH.values())


def _measure(way: str, model: Any, inputs: tuple, ref: Any, plan: Any, iters: int,
             base: dict[str, float]) -> dict[str, Any]:
    import torch

    notes: dict[str, Any] = {}
    fn, cleanup = _forward(way, model, inputs, plan, notes)
    try:
        via = _via_torch()
        out = _first(fn()).detach().float().clone()  # the first call also compiles
        via = _via_torch() - via  # an eager forward's linears run as torch's own call
        ms = tb.events_ms(fn, warmup=3, iters=iters)
        row: dict[str, Any] = {"ms": ms}
        if way != "eager":
            err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            row["rel err"] = err
            row["ok"] = "yes" if err <= TOLERANCE and torch.isfinite(out).all() else "NO"
        base[way] = ms
        if "eager" in base and way != "eager":
            row["x eager"] = base["eager"] / ms
        if "compile-ro" in base and way.startswith("dnnctl"):
            row["x compile-ro"] = base["compile-ro"] / ms
        if "compile-ro+freeze" in base and way == "dnnctl+compile-ro+freeze":
            row["x compile-ro+freeze"] = base["compile-ro+freeze"] / ms
        report = notes.get("report")
        if report is not None:
            fb = sum(report.fallbacks().values())
            row["patch"] = (f"{len(report.covered)} mods, {len(report.fusions)} fused, "
                            f"{len(report.skipped)} skipped, {fb} fallback calls")
            if way == "dnnctl" and via:
                row["patch"] += f", {via} vendor linears via torch"
            if report.graphs:
                import dnnctl.torch as dt

                gi = dt.graph_info(model)
                row["patch"] += (f", graphs: {gi.captures} captured, {gi.replays} replays, "
                                 f"{gi.eager} eager" + "".join(f", refused: {r}"
                                                               for r in gi.refused))
        return row
    finally:
        cleanup()


def run(configs: dict[str, tuple[str, ...]], plan_path: str | None, record_dir: str | None,
        iters: int) -> list[dict[str, Any]]:
    import torch

    import dnnctl

    plan = dnnctl.load_plan(plan_path) if plan_path else None
    rows: list[dict[str, Any]] = []
    for name, ways in configs.items():
        rows += _config_rows(name, ways, plan, record_dir, iters)
        torch.cuda.empty_cache()
    return rows


def _config_rows(name: str, ways: tuple[str, ...], plan: Any, record_dir: str | None,
                 iters: int) -> list[dict[str, Any]]:
    import torch

    try:
        model, inputs = models.build(name)
    except Exception as exc:  # e.g. out of memory: the other models go on
        return [tb.safe_row({"model": name, "way": "build"}, lambda e=exc: _raise(e))]
    rows = []
    if record_dir:
        rows.append(tb.safe_row({"model": name, "way": "record"},
                                lambda: _record(model, inputs, name, record_dir)))
    with torch.inference_mode():
        ref = _first(model(*inputs)).detach().float().clone()
        base: dict[str, float] = {}
        for way in ways:
            rows.append(tb.safe_row({"model": name, "way": way},
                                    lambda w=way: _measure(w, model, inputs, ref, plan, iters,
                                                           base)))
            # each row as it comes (stderr): a run cut by a time limit keeps what it measured
            print(json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
    return rows


def _raise(exc: Exception) -> dict[str, Any]:
    raise exc


def _record(model: Any, inputs: tuple, name: str, out_dir: str) -> dict[str, Any]:
    import dnnctl.torch as dt

    wl = dt.record(model, inputs, name=name)
    path = Path(out_dir) / f"{name}.workload.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    wl.save(path)
    return {"patch": f"{len(wl.items)} problems, {wl.total_calls()} calls -> {path}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="LLaMA decode five ways and ResNet-50 b1 eager vs dnnctl (~2 min)")
    ap.add_argument("--plan", help="tuned plan used by the dnnctl ways")
    ap.add_argument("--record-workload", metavar="DIR",
                    help="write each model's recorded workload to DIR/<config>.workload.yaml")
    ap.add_argument("--models", help=f"comma list of {', '.join(models.CONFIGS)}")
    ap.add_argument("--ways", help=f"comma list of {', '.join(WAYS)}")
    ap.add_argument("--iters", type=int, default=20, help="timed forwards per way")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_e2e: needs a CUDA GPU with a CUDA build of torch")
        return 3
    if args.quick and not (args.models or args.ways):
        configs = dict(QUICK)
    else:
        names = args.models.split(",") if args.models else list(models.CONFIGS)
        unknown = [n for n in names if n not in models.CONFIGS]
        if unknown:
            ap.error(f"unknown model config(s) {unknown}; choose from {list(models.CONFIGS)}")
        ways = tuple(args.ways.split(",")) if args.ways else WAYS
        bad = [w for w in ways if w not in WAYS]
        if bad:
            ap.error(f"unknown way(s) {bad}; choose from {list(WAYS)}")
        configs = {n: ways for n in names}
    rows = run(configs, args.plan, args.record_workload, 5 if args.quick else args.iters)
    tb.finish(TITLE, rows, args.out, {"plan": args.plan, "tolerance": TOLERANCE})
    return 0


if __name__ == "__main__":
    sys.exit(main())
