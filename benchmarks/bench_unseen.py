"""Shapes nobody tuned for: dnnctl's default heuristic and a quick tune against cuDNN/cuBLAS.

The problems (benchmarks/unseen_cases.py, with their source models) come from published
architectures outside the bundled workloads: Stable Diffusion UNet, EfficientNet-B0,
ConvNeXt-T, YOLOv8, Whisper's conv front-end, DeepLabv3, an odd 5x5/2; LLaMA-2-7B,
Mistral-7B and Mixtral-8x7B projections at prefill and decode, bf16 squares, and
matmul + bias + GELU against torch's F.linear + F.gelu.

Per problem, three ways on the same tensors:

* **torch**: F.conv2d with cudnn.benchmark = True (channels_last for NHWC, TF32 allowed for
  fp32 as torch does by default), or F.linear / matmul (cuBLAS) then F.gelu;
* **default**: what an un-tuned dnnctl call runs (the op's default_choice: the cost model);
* **tuned**: the fastest of the default, the vendor libraries' candidates (cuDNN, cuBLAS:
  the tuner always measures them) and TOP_K more cost-model candidates (the best
  estimate of each other variant first, then the next best overall), each timed briefly: a
  quick tune without the tuner's worker processes (``--top-k`` sets K). The depthwise
  variants also try DEPTHWISE_EXTRA block shapes of benchmarks/conv_candidates.py (the cost
  model scores only their defaults).

Every candidate is checked against torch's output first (relative error <= 2e-2 for 16-bit,
1e-2 for TF32; a wrong one is reported and cannot win). Timing: benchmarks/common.py
(CUDA events, warm-up, L2 flushed before every sample, medians); torch, the default and the
tuned pick are re-timed in three interleaved rounds. Kernels are compiled first by a process
pool. Rows past the time budget are listed as skipped.

    PYTHONPATH=. python3 benchmarks/bench_unseen.py [--quick] [--only conv,gemm]
        [--top-k 4] [--budget 230] [--out unseen.json]
    PYTHONPATH=. python3 benchmarks/run.py --only unseen [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import unseen_cases  # noqa: E402

TITLE = "unseen shapes: dnnctl default heuristic and quick tune vs cuDNN / cuBLAS"
TOP_K = 4
BUDGET_S = 230.0
PRECOMPILE_S = 90.0
ROUNDS = 3
HOPELESS = 3.0
DEPTHWISE_EXTRA = 4  # block shapes per depthwise variant (benchmarks/conv_candidates.py)


def candidates(problem: Any, device: Any, top_k: int) -> list[tuple[str, dict[str, Any]]]:
    """The default choice first, then every vendor candidate (as the tuner: it always
    measures them), then the cost model's best candidate of each other variant (within
    HOPELESS of the best estimate), then its next best overall, up to ``top_k`` besides
    the default and the vendors."""
    from dnnctl.ops.explain import ranked_estimates
    from dnnctl.ops.registry import get_op, variants

    default = get_op(problem.op).default_choice(problem, "cupy", device)
    out = [(default.variant, default.param_dict)]
    # the vendor libraries' candidates (cuDNN, cuBLAS), as the tuner measures them: always,
    # right after the default (dnnctl/tune/candidates.py: the bar a plan must clear)
    for v in variants(problem.op, "cupy"):
        if v.vendor and v.supports(problem, device):
            out += [(v.name, p) for p in v.param_space(problem, device)
                    if (v.name, p) not in out]
    est = ranked_estimates(problem, "cupy", device)
    ranked = [(e.variant, dict(e.params)) for e in est]
    # another variant's best is worth a try when estimated within HOPELESS of the best
    firsts = [c for i, (c, e) in enumerate(zip(ranked, est))
              if all(c[0] != d[0] for d in ranked[:i]) and e.us <= HOPELESS * est[0].us]
    limit = len(out) + top_k
    for cand in firsts + ranked:
        if len(out) >= limit:
            break
        if cand not in out:
            out.append(cand)
    if problem.op == "conv2d":  # block shapes of the depthwise kernels: not in the model
        import conv_candidates

        from dnnctl.ops.registry import get_variant

        for name in ("depthwise", "depthwise_planes", "depthwise_tile"):
            if any(n == name for n, _ in out) or name == "depthwise_tile":
                variant = get_variant("conv2d", "cupy", name)
                extra = [(name, p) for p in conv_candidates.shortlist(variant, problem, device)]
                out += [c for c in extra if c not in out][:DEPTHWISE_EXTRA]
    return out


def record_jobs(todo: list[Any], device: Any, top_k: int) -> list[tuple]:
    """The modules every candidate builds; runs in a child process so that nothing built
    under the recorder is kept."""
    from dnnctl.ops.precompile import record_builds
    from dnnctl.ops.registry import get_op, get_variant

    builds = []
    for case in todo:
        p = get_op(case.op).problem(case.key_dict)
        for name, params in candidates(p, device, top_k):
            builds.append((get_variant(case.op, "cupy", name), p, params))
    return record_builds(builds, device)


def _torch_setup(case: Any) -> tuple[Callable[[], Any], dict[str, Any], Callable[[Any], Any]]:
    """torch's function, dnnctl's inputs on the same memory, and the output view to compare."""
    import cupy as cp
    import torch
    import torch.nn.functional as F

    k, dev = case.key_dict, torch.device("cuda")
    tdt = getattr(torch, k["dtype"])
    if case.op == "matmul":
        shape_a = (k["m"], k["k"]) if k["batch"] == 1 else (k["batch"], k["m"], k["k"])
        shape_w = (k["n"], k["k"]) if k["batch"] == 1 else (k["batch"], k["n"], k["k"])
        a = torch.randn(shape_a, device=dev).to(tdt)
        w = (torch.randn(shape_w, device=dev) / math.sqrt(k["k"])).to(tdt)
        b = (torch.randn(k["n"], device=dev) * 0.5).to(tdt) if k["bias"] else None

        def fn() -> Any:
            y = F.linear(a, w, b) if k["batch"] == 1 else torch.matmul(a, w.transpose(-1, -2))
            return F.gelu(y) if k["activation"] == "gelu" else y

        ins = {"a": cp.from_dlpack(a), "b": cp.from_dlpack(w)}
        if b is not None:
            ins["bias"] = cp.from_dlpack(b)
        return fn, ins, lambda t: t
    x = torch.randn(k["n"], k["c"], k["h"], k["w"], device=dev).to(tdt)
    fan = k["c"] // k["groups"] * k["r"] * k["s"]
    w = (torch.randn(k["k"], k["c"] // k["groups"], k["r"], k["s"], device=dev)
         / math.sqrt(fan)).to(tdt)
    b = torch.randn(k["k"], device=dev).to(tdt)
    nhwc = k["layout"] == "NHWC"
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)

    def fn() -> Any:
        return F.conv2d(x, w, b, stride=tuple(k["stride"]), padding=tuple(k["pad"]),
                        dilation=tuple(k["dilation"]), groups=k["groups"])

    def perm(t: Any) -> Any:
        return t.permute(0, 2, 3, 1) if nhwc else t

    ins = {"x": cp.from_dlpack(perm(x).detach()), "w": cp.from_dlpack(perm(w).detach()),
           "bias": cp.from_dlpack(b)}
    return fn, ins, lambda t: perm(t).contiguous()


def bench_case(case: Any, device: Any, top_k: int) -> dict[str, Any]:
    """One row: torch, default and tuned times (re-timed interleaved), ratios, TFLOP/s."""
    with contextlib.ExitStack() as stack:  # torch views of the inputs, for vendor calls
        return _bench_case(case, device, top_k, stack)


def _bench_case(case: Any, device: Any, top_k: int, stack: contextlib.ExitStack
                ) -> dict[str, Any]:
    import cupy as cp

    from dnnctl.ops.registry import get_op, get_variant

    op = get_op(case.op)
    problem = op.problem(case.key_dict)
    torch_fn, inputs, view = _torch_setup(case)
    ref = cp.from_dlpack(view(torch_fn())).astype(cp.float32)
    ref_norm = float(cp.linalg.norm(ref)) or 1.0
    y = cp.empty(op.output_specs(problem)["y"].shape, dtype=next(iter(inputs.values())).dtype)
    tol = 1e-2 if case.key_dict["dtype"] == "float32" else 2e-2
    timed: list[tuple[float, str, Callable[[], None]]] = []
    notes: list[str] = []
    estimates = _estimates(problem, device)
    measured: list[dict[str, Any]] = []  # every timed candidate, with the model's estimate
    for i, (name, params) in enumerate(candidates(problem, device, top_k)):
        label = candidate_label(name, params)
        try:
            variant = get_variant(case.op, "cupy", name)
            kern = variant.build(problem, params, device)
            y.fill(float("nan"))
            run, got = common.candidate_call(stack, variant, kern, inputs, {"y": y})
            err = float(cp.linalg.norm(got["y"].astype(cp.float32) - ref)) / ref_norm
        except Exception as exc:  # a failed candidate is skipped, as the tuner does
            notes.append(f"{label}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        if not err <= tol:
            notes.append(f"{label}: wrong (rel err {err:.3g})")
            continue

        us = common.time_us(run, warmup_ms=2, budget_ms=10)["median_us"]
        timed.append((us if i else -1.0, label, run))  # -1: keeps the default first
        measured.append({"candidate": label, "us": round(us, 2), "default": i == 0,
                         "est_us": estimates.get((name, _key(params)))})
    row: dict[str, Any] = {"config": case.config, "shape": case.name, "source": case.source}
    if not timed or timed[0][0] != -1.0:
        row["error"] = "default choice failed: " + "; ".join(notes)[:200]
        return row
    default = timed[0]
    best = min(timed[1:] + [(common.time_us(default[2], warmup_ms=2, budget_ms=10)
                             ["median_us"], default[1], default[2])], key=lambda t: t[0])
    finals = {"torch": torch_fn, "default": default[2], "tuned": best[2]}
    rounds: dict[str, list[float]] = {k: [] for k in finals}
    for _ in range(ROUNDS):  # interleaved, so drift hits everyone alike
        for k, fn in finals.items():
            rounds[k].append(common.time_us(fn, warmup_ms=2, budget_ms=15)["median_us"])
    t = {k: statistics.median(v) for k, v in rounds.items()}
    t["tuned"] = min(t["tuned"], t["default"])  # the tune keeps the default when it wins
    flops = op.flops(problem)
    row.update(torch_us=t["torch"], default_us=t["default"], tuned_us=t["tuned"],
               default_ratio=t["torch"] / t["default"], tuned_ratio=t["torch"] / t["tuned"],
               default_vs_tuned=t["tuned"] / t["default"],
               torch_tflops=flops / t["torch"] / 1e6, tuned_tflops=flops / t["tuned"] / 1e6,
               default=default[1], tuned=best[1] if t["tuned"] < t["default"] else default[1])
    if notes:
        row["notes"] = "; ".join(notes)[:200]
    row["candidates"] = measured  # for checking the cost model (check_heuristic.py)
    return row


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def _estimates(problem: Any, device: Any) -> dict[tuple[str, tuple], float]:
    """The cost model's estimate (us) of each candidate it scores, by (variant, params)."""
    from dnnctl.ops.explain import ranked_estimates

    try:
        est = ranked_estimates(problem, "cupy", device)
    except Exception:  # noqa: BLE001 - an op without a cost model: no estimates
        return {}
    return {(e.variant, _key(dict(e.params))): round(e.us, 2) for e in est}


def candidate_label(variant: str, params: dict[str, Any]) -> str:
    """How a candidate is named in the rows and the JSON (``implicit_gemm 128x64x32 w4 ...``)."""
    return variant if not params else f"{variant} {_short(params)}"


def _short(params: dict[str, Any]) -> str:
    if {"bm", "bn"} <= set(params):
        rest = {k: v for k, v in params.items()
                if k not in ("bm", "bn", "bk", "warps", "stages", "splitk")}
        s = f"{params['bm']}x{params['bn']}x{params.get('bk', '')} w{params.get('warps')}" \
            f" s{params.get('stages')} sk{params.get('splitk', 1)}"
        return s + "".join(f" {k}={v}" for k, v in sorted(rest.items()))
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


def run(ctx: Any, quick: bool, only: str = "conv,gemm", top_k: int = TOP_K,
        budget_s: float = BUDGET_S) -> list[dict[str, Any]]:
    """Every case within the time budget (run.py's section entry point)."""
    import cupy as cp
    import torch

    t0 = time.time()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = common.backend().device(cp.cuda.Device().id)
    todo = unseen_cases.cases(quick, only)
    print(f"  {common.precompile(record_jobs, (todo, dev, top_k), PRECOMPILE_S)}", flush=True)
    rows, skipped = [], 0
    for case in todo:
        if time.time() - t0 > budget_s:
            skipped += 1
            continue
        try:
            rows.append(bench_case(case, dev, top_k))
        except Exception as exc:  # keep the section going; record the miss
            rows.append({"config": case.config, "shape": case.name,
                         "error": f"{type(exc).__name__}: {exc}"[:160]})
        print(f"  {({k: v for k, v in rows[-1].items() if k != 'candidates'})}", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if skipped:
        rows.append({"config": "skipped (time budget)", "shape": f"{skipped} rows"})
    return rows


def summary(rows: list[dict[str, Any]], ctx: Any = None) -> str:
    """Geomeans per group and the issue's goals."""
    ok = [r for r in rows if "tuned_ratio" in r]
    lines = []
    groups = {"conv fp16 NHWC": lambda r: r["config"] == "float16 NHWC",
              "conv fp32 NCHW (TF32)": lambda r: r["config"] == "float32 NCHW",
              "GEMM": lambda r: " " not in r["config"]}
    for name, pred in groups.items():
        sel = [r for r in ok if pred(r)]
        if sel:
            lines.append(
                f"- {name}: {len(sel)} shapes; geomean torch/ours default "
                f"{common.geomean([r['default_ratio'] for r in sel]):.2f}, tuned "
                f"{common.geomean([r['tuned_ratio'] for r in sel]):.2f}; tuned below 0.9x: "
                f"{sum(r['tuned_ratio'] < 0.9 for r in sel)}")
    conv = [r for r in ok if " " in r["config"]]
    if conv:
        lines.append(f"- conv goal (tuned geomean >= 1.1, none below 0.9): geomean "
                     f"{common.geomean([r['tuned_ratio'] for r in conv]):.2f}, min "
                     f"{min(r['tuned_ratio'] for r in conv):.2f}")
    near = sum(r["default_vs_tuned"] >= 1 / 1.1 for r in ok)
    if ok:
        lines.append(f"- default heuristic within 10% of the tuned choice: {near}/{len(ok)} "
                     f"({100 * near / len(ok):.0f}%; goal >= 80%)")
    for r in ok:
        if r["shape"].startswith("square") or "gelu" in r["shape"]:
            lines.append(f"- {r['shape']}: tuned {r['tuned_ratio']:.2f}x torch ({r['tuned']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a representative subset (~2 min)")
    ap.add_argument("--only", default="conv,gemm", help="conv, gemm or both")
    ap.add_argument("--top-k", type=int, default=TOP_K,
                    help="cost-model candidates timed besides the default (the quick tune)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the rows")
    ap.add_argument("--out", type=Path, help="write the rows and summary as JSON here")
    args = ap.parse_args(argv)
    ctx = common.measure_ceilings()
    print(ctx.header(), flush=True)
    t0 = time.time()
    rows = run(ctx, args.quick, args.only, args.top_k, args.budget)
    text = f"### {TITLE}\n\n" + common.markdown(rows) + "\n" + summary(rows) + \
        f"\n\n({time.time() - t0:.0f} s)\n"
    print(text, flush=True)
    if args.out:
        args.out.write_text(json.dumps({"ctx": ctx.__dict__, "rows": rows,
                                        "summary": summary(rows)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
