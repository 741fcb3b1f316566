#!/usr/bin/env python3
"""Run every benchmark section on the GPU and print markdown tables for RESULTS.md.

    PYTHONPATH=. python3 benchmarks/run.py [--quick] [--only memory,conv,gemm,linear_act,tune]

Writes bench.md / bench.json under $OUT (or ./.devout) as well.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

SECTIONS = ("memory", "conv", "gemm", "linear_act", "tune")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    ap.add_argument("--only", default=",".join(SECTIONS))
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT") or ".devout")
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = common.measure_ceilings()
    md = [ctx.header(), ""]
    print(ctx.header(), flush=True)
    results = {"ctx": ctx.__dict__, "sections": {}}
    for name in args.only.split(","):
        name = name.strip()
        try:
            mod = importlib.import_module(f"bench_{name}")
        except ModuleNotFoundError as exc:
            print(f"[skip {name}: {exc}]", flush=True)
            continue
        t0 = time.time()
        try:
            rows = mod.run(ctx, args.quick)
        except Exception:
            traceback.print_exc()
            rows = []
        text = f"### {mod.TITLE}\n\n" + common.markdown(rows)
        extra = getattr(mod, "summary", None)
        if extra and rows:
            text += "\n" + extra(rows, ctx) + "\n"
        text += f"\n({time.time() - t0:.0f} s)\n"
        md.append(text)
        results["sections"][name] = rows
        (out_dir / "bench.md").write_text("\n".join(md))
        (out_dir / "bench.json").write_text(json.dumps(results, indent=1, default=str))
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
