#!/usr/bin/env python3
"""Which of dnnctl's backward kernels break a CUDA-graph capture of a patched training step.

    PYTHONPATH=. python3 tools/capture_probe.py [--case resnet,vit]

For each op whose backward the patched model's step runs (``conv2d``, ``batch_norm``, ...), one
subprocess per op: only that op's backward on dnnctl, the rest on torch's formulas; then every
op's at once. Each runs the eager steps, then captures the step and replays it: PASS when the
replays' losses stay within 0.2% of the eager steps', else FAIL with both, and (either way)
the parameters whose gradients after the first replay are furthest from the eager step's, or
the error with its traceback (the first failing call names the culprit). Last, the same eager
steps twice (``repeat``): how far run-to-run noise alone puts the losses apart. Needs a GPU,
torch and CuPy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP, STEPS = 3, 4


def _one(case: str, label: str) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from _torch_models import train_step, training_case

    import dnnctl.torch as dt
    from dnnctl.torch import grad_plan

    mode = "dnnctl" if label in ("all", "list", "repeat") else {label: "dnnctl", "*": "torch"}

    def build():
        m, x, y, loss_fn, amp, make_opt = training_case(case)  # seeded: the same each time
        dt.patch(m, backward=mode)
        return m, make_opt(m.parameters()), x, y, loss_fn, amp

    model, opt, x, y, loss_fn, amp = build()

    def step(cache=True):
        return train_step(model, opt, x, y, loss_fn, amp, cache)

    def eager() -> tuple[list[float], dict]:
        """The eager steps' losses, and each parameter's gradient at the step the first
        replay repeats; a fresh (seeded) model and optimizer afterwards."""
        nonlocal model, opt
        losses, grads = [], {}
        for i in range(WARMUP + STEPS):
            opt.zero_grad(set_to_none=True)
            losses.append(float(step().detach()))
            if i == WARMUP:
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                         if p.grad is not None}
        model, opt = build()[:2]
        return losses, grads

    if label == "repeat":  # the same eager steps twice: how far apart run-to-run noise puts them
        runs = [eager()[0], eager()[0]]
        rel = max(abs(a - b) / abs(b) for a, b in zip(*runs))
        return {"ok": True, "paths": {"losses": runs, "max_rel_diff": rel}}

    losses, grads = ([], {}) if label == "list" else eager()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    grad_plan.BACKWARD_PATHS.clear()
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    if label == "list":
        return {"labels": sorted({k.split("/")[0] for k in grad_plan.paths_summary()})}
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    grad_plan.BACKWARD_PATHS.clear()
    try:
        with torch.cuda.graph(graph):
            static_loss = step(cache=False)
        replayed, off = [], []
        for i in range(STEPS):
            graph.replay()
            replayed.append(float(static_loss.detach()))
            if i == 0:  # the first replay's gradients against the eager step's
                for n, p in model.named_parameters():
                    if n in grads and p.grad is not None:
                        e = grads[n].float()
                        off.append((float((p.grad.float() - e).norm() / e.norm().clamp_min(1e-30)), n))
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the probe reports whatever broke
        return {"ok": False, "error": traceback.format_exc()[-3000:],
                "paths": grad_plan.paths_summary()}
    rel = max(abs(a - b) / abs(b) for a, b in zip(replayed, losses[WARMUP:]))
    return {"ok": rel <= 2e-3, "paths": {"max_rel_loss_diff": rel, "replayed": replayed,
                                         "eager": losses[WARMUP:],
                                         "worst_grads": sorted(off, reverse=True)[:4]},
            "error": "" if rel <= 2e-3 else "replayed losses depart from the eager steps'"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", default="resnet,vit")
    p.add_argument("--one", nargs=2, metavar=("CASE", "LABEL"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(_one(*a.one)))
        return 0
    bad = 0
    for case in a.case.split(","):
        run = [sys.executable, __file__, "--one", case]
        out = subprocess.run(run + ["list"], capture_output=True, text=True, timeout=300)
        labels = json.loads(out.stdout.strip().splitlines()[-1])["labels"]
        for label in labels + ["all", "repeat"]:
            res = subprocess.run(run + [label], capture_output=True, text=True, timeout=300)
            try:
                r = json.loads(res.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                r = {"ok": False, "error": res.stderr[-3000:]}
            bad += not r["ok"]
            print(f"## {case} {label}: {'PASS' if r['ok'] else 'FAIL'}  {r.get('paths', '')}")
            if not r["ok"]:
                print(r["error"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
