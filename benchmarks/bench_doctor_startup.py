"""Time ``python -m dnnctl doctor`` as a whole process (issue 15: median <= 0.3 s).

Each source tree given is run in turn (A B A B ...) after one warm-up run each, from a
neutral directory, with PYTHONPATH pointing at the tree; wall time and CPU time (the process
and its children) per run; median, min and max. Extra doctor arguments go after ``--``.

Run from the repository root:
    PYTHONPATH=. python benchmarks/bench_doctor_startup.py 21 .
    PYTHONPATH=. python benchmarks/bench_doctor_startup.py 21 . /path/to/other/tree -- --json
No GPU needed (on a GPU host the NVML and cuDNN children do real work). For the per-probe
breakdown of one run: ``python -m dnnctl doctor --timings``.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def one(tree: str, extra: list[str]) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dnnctl", "doctor", *extra], env=env,
                   cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = argv[:argv.index("--")] if "--" in argv else argv
    n, trees = int(args[0]) if args else 21, args[1:] or ["."]
    runs: dict[str, tuple[list[float], list[float]]] = {t: ([], []) for t in trees}
    for tree in trees:
        one(tree, extra)  # warm-up: page cache, the matrix cache
    for _ in range(n):
        for tree in trees:
            wall, cpu = one(tree, extra)
            runs[tree][0].append(wall)
            runs[tree][1].append(cpu)
    for tree, (wall, cpu) in runs.items():
        print(f"{tree}: n={n} wall median {statistics.median(wall):.3f} s "
              f"(min {min(wall):.3f}, max {max(wall):.3f}); "
              f"cpu median {statistics.median(cpu):.3f} s")
    print(f"load average {os.getloadavg()[0]:.2f}; {sys.executable}")


if __name__ == "__main__":
    main(sys.argv[1:])
