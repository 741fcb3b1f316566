"""benchmarks/bench_tune.py --workload: one whole bundled workload as the subset to tune and
judge (the decision-quality check of issue 14), without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_tune  # noqa: E402

from dnnctl.errors import UsageError  # noqa: E402


def test_whole_workload_is_every_problem():
    from dnnctl.workloads import build

    [(name, wl)] = bench_tune.whole("resnet50", 32)
    assert name == "resnet50 b32"
    full = build("resnet50", batch=32)
    assert [(it.problem, it.count) for it in wl.items] == \
        [(it.problem, it.count) for it in full.items]
    assert len(wl.items) == 31  # what RESULTS.md's resnet50 plan covers
    with pytest.raises(UsageError):
        bench_tune.whole("no_such_workload")


def test_cli_parses_the_whole_workload_options(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_tune.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--workload" in out and "--evals" in out and "--budget" in out
