"""Time loading and validating a large plan (20,000 entries by default; issue 16: <= 2 s).

Builds a realistic plan, one H200 section of conv2d / matmul / softmax / layer_norm entries
whose choices are the ops' own default heuristics (so every entry passes ``supports()``),
writes it, then times the stages a user pays for:

* ``parse (cold)``: YAML text -> Python data (libyaml's C loader when PyYAML has it), the
  first time this content is seen;
* ``read_plan``: parse (now from the parsed-file cache, dnnctl.files.parsecache) + schema /
  registry validation of every entry;
* ``plan validate``: the CLI's check, which also asks ``supports()`` for every entry;
* ``load_plan``: the run-time load (lookup tables for this machine's device).

Run from the repository root:  PYTHONPATH=. python benchmarks/bench_plan_load.py [N]
No GPU needed. Prints one line per stage and the file size.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops import registry
from dnnctl.plan import Plan, PlanEntry, Section, Timing, kernels_digest, plan_text
from dnnctl.plan.schema import Alternative

H200 = {"backend": "cupy", "name": "NVIDIA H200", "compute_capability": "9.0",
        "sm_count": 132, "driver": "580.95.05", "cuda_runtime": "13.0", "dnnctl": "0.1.0"}


def problems(n: int) -> list[Any]:
    """``n`` distinct, valid problems over four ops (ResNet / BERT-like shape grids)."""
    conv = registry.get_op("conv2d")
    mm = registry.get_op("matmul")
    sm = registry.get_op("softmax")
    ln = registry.get_op("layer_norm")
    out: list[Any] = []
    grids = [
        (conv.problem(n=b, c=c, h=h, w=h, k=k, r=r, s=r, pad=r // 2, stride=st,
                      dtype="float16", layout="NHWC")
         for b, c, h, k, r, st in itertools.product((1, 2, 4, 8, 16, 32, 64),
                                                    (16, 32, 64, 128, 256, 512),
                                                    (7, 14, 28, 56, 112),
                                                    (16, 32, 64, 128, 256, 512), (1, 3, 5),
                                                    (1, 2))),
        (mm.problem(m=m, n=nn, k=k, dtype=dt)
         for m, nn, k, dt in itertools.product(range(32, 4097, 32), (768, 1024, 3072, 4096, 8192),
                                               (768, 1024, 3072, 4096),
                                               ("float16", "bfloat16"))),
        (sm.problem(rows=r, cols=c, dtype="float16")
         for r, c in itertools.product(range(64, 65537, 64), (128, 512, 2048, 8192))),
        (ln.problem(rows=r, cols=c, dtype="float16")
         for r, c in itertools.product(range(64, 65537, 64), (768, 1024, 4096, 8192))),
    ]
    while len(out) < n:  # round-robin over the grids (about 20,800 problems in all)
        before = len(out)
        for grid in grids:
            p = next(grid, None)
            if p is not None and len(out) < n:
                out.append(p)
        if len(out) == before:
            raise SystemExit(f"only {len(out)} distinct problems; ask for fewer")
    return out


def build_plan(n: int) -> Plan:
    dev = DeviceInfo(backend="cupy", index=0, name=H200["name"], compute_capability="9.0",
                     sm_count=132, driver=H200["driver"], cuda_runtime="13.0",
                     smem_per_block_optin=232448)
    entries = []
    for p in problems(n):
        choice = registry.get_op(p.op).default_choice(p, "cupy", dev)
        entries.append(PlanEntry(p, choice, Timing(21.4, 21.1, 21.9, 180),
                                 Alternative(choice, 35.2), Alternative(choice, 35.2),
                                 tried=48, failed={"wrong": 0, "crashed": 0, "timeout": 0,
                                                   "oom": 0}, max_rel_err=2.1e-4))
    return Plan([Section(dict(H200), kernels_digest(), "2026-12-02T11:00:00Z",
                         {"warmup_ms": 25, "budget_ms": 100}, entries)])


def main(argv: list[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 20_000
    from dnnctl import api
    from dnnctl.files.yamlio import load_yaml
    from dnnctl.plan import load_plan, read_plan

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # start cold, leave nothing
        path = Path(tmp) / "big.yaml"
        path.write_text(plan_text(build_plan(n)), encoding="utf-8")
        size = path.stat().st_size
        print(f"plan: {n} entries, {size / 1e6:.1f} MB")
        for label, fn in (("parse (cold)", lambda: load_yaml(path)),
                          ("read_plan", lambda: read_plan(path)),
                          ("plan validate", lambda: api.plan_validate(path)),
                          ("load_plan", lambda: load_plan(path, device="cpu"))):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            print(f"{label:>14}: {time.perf_counter() - t0:6.2f} s wall, "
                  f"{time.process_time() - c0:6.2f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
