"""Time loading and validating a large plan (20,000 entries by default; issue 16: every
stage <= 2 s, cold).

Builds a realistic plan, one H200 section of conv2d / matmul / softmax / layer_norm entries
whose choices are the ops' own default heuristics (so every entry passes ``supports()``),
writes it as ``dnnctl tune`` would (each entry one line of JSON, see
dnnctl.files.lineyaml), then times each stage in a fresh Python process with an empty
parsed-file cache, so imports, the op registry and the parse are all paid as a user pays
them:

* ``parse``: the file's text -> Python data (``dnnctl.files.yamlio.load_yaml``);
* ``read_plan``: parse + schema / registry validation of every entry;
* ``plan validate``: the CLI's check (``api.plan_validate``), which also asks
  ``supports()`` for every entry on the section's device;
* ``load_plan``: the run-time load on the H200 the section was made on: validation, then
  the lookup tables, ``supports()`` again for every entry;
* ``dnnctl plan validate``: the whole command, interpreter start-up included.

Building the plan (each entry's choice from the cost model) takes about two minutes for
20,000 entries; the timed stages do not include it.

Run from the repository root:  PYTHONPATH=. python benchmarks/bench_plan_load.py [N]
``--plan FILE`` times an existing plan instead (e.g. one in the older all-YAML form);
``--yaml`` also times the parse of the same plan written all in YAML (the form before
lineyaml, read by libyaml: several seconds). No GPU needed. Prints one line per stage (wall
and CPU seconds) and the file size. Times on a shared machine vary by half: run it twice.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnctl import __version__
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops import registry
from dnnctl.plan import Plan, PlanEntry, Section, Timing, kernels_digest, plan_text
from dnnctl.plan.schema import Alternative

H200 = {"backend": "cupy", "name": "NVIDIA H200", "compute_capability": "9.0",
        "sm_count": 132, "driver": "580.95.05", "cuda_runtime": "13.0", "dnnctl": __version__}


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
    dev = h200()
    entries = []
    for p in problems(n):
        choice = registry.get_op(p.op).default_choice(p, "cupy", dev)
        entries.append(PlanEntry(p, choice, Timing(21.4, 21.1, 21.9, 180),
                                 Alternative(choice, 35.2), Alternative(choice, 35.2),
                                 tried=48, failed={"wrong": 0, "crashed": 0, "timeout": 0,
                                                   "oom": 0}, max_rel_err=2.1e-4))
    return Plan([Section(dict(H200), kernels_digest(), "2026-12-02T11:00:00Z",
                         {"warmup_ms": 25, "budget_ms": 100}, entries)])


def h200() -> DeviceInfo:
    """The device the plan's section was made on (fingerprint included)."""
    return DeviceInfo(backend="cupy", index=0, name=H200["name"], compute_capability="9.0",
                      sm_count=132, driver=H200["driver"], cuda_runtime="13.0",
                      smem_per_block_optin=232448)


def _parse(path: Path) -> Any:
    from dnnctl.files.yamlio import load_yaml

    return load_yaml(path)


def _read_plan(path: Path) -> Any:
    from dnnctl.plan import read_plan

    return read_plan(path)


def _validate(path: Path) -> Any:
    from dnnctl import api

    return api.plan_validate(path)


def _load_plan(path: Path) -> Any:
    """The run-time load on the plan's H200: True when its lookup tables were built (the
    section is this dnnctl's, not stale)."""
    import warnings

    from dnnctl.plan import load_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_plan(path, device=h200())
    return loaded.section_for("cupy", h200()) is not None


STAGES: dict[str, Callable[[Path], Any]] = {
    "parse": _parse, "read_plan": _read_plan, "plan validate": _validate,
    "load_plan": _load_plan,
}


def run_stage(name: str, path: Path) -> None:
    """Child process: time one stage, print {wall, cpu, result} as JSON."""
    fn = STAGES[name]
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn(path)
    print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                      "tables": result if name == "load_plan" else None}))


def _child(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    shutil.rmtree(cache, ignore_errors=True)  # every stage starts cold
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          check=False)


def _report(label: str, path: Path, cache: Path) -> None:
    proc = _child([__file__, "--stage", label, str(path)], cache)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed:\n{proc.stderr}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    note = "  (stale for this dnnctl: no lookup tables built)" if r["tables"] is False else ""
    print(f"{label:>22}: {r['wall']:6.2f} s wall, {r['cpu']:6.2f} s CPU{note}")


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] == ["--stage"]:
        run_stage(args[1], Path(args[2]))
        return 0
    given = None
    if "--plan" in args:
        i = args.index("--plan")
        given = Path(args[i + 1])
        del args[i:i + 2]
    also_yaml = "--yaml" in args
    args = [a for a in args if a != "--yaml"]
    n = int(args[0]) if args else 20_000

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        path = Path(tmp) / "big.yaml"
        if given is not None:
            shutil.copyfile(given, path)
            plan = None
        else:
            plan = build_plan(n)
            path.write_text(plan_text(plan), encoding="utf-8")
        print(f"plan: {path.stat().st_size / 1e6:.1f} MB"
              + (f", {n} entries" if plan is not None else f" ({given})"))
        for label in STAGES:
            _report(label, path, cache)
        t0 = time.perf_counter()
        proc = _child(["-m", "dnnctl", "plan", "validate", str(path)], cache)
        if proc.returncode != 0:
            raise SystemExit(f"dnnctl plan validate failed:\n{proc.stdout}{proc.stderr}")
        print(f"{'dnnctl plan validate':>22}: {time.perf_counter() - t0:6.2f} s wall "
              "(the whole command)")
        if also_yaml and plan is not None:
            from dnnctl.files.yamlio import dump_yaml

            path.write_text(dump_yaml(plan.to_data()), encoding="utf-8")
            _report("parse", path, cache)
            print("  (the line above: the same plan all in YAML, the form before lineyaml)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
