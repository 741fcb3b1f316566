"""``tune --ray`` on a local Ray cluster started here with two fake GPUs and the numpy
backend: one task per problem, a killed worker's task re-run by Ray, results in the
journal (resume), one plan section per device fingerprint."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from typer.testing import CliRunner  # noqa: E402

from dnnctl.backends.registry import get_backend  # noqa: E402
from dnnctl.cli.app import _optional_values, app  # noqa: E402
from dnnctl.plan import read_plan  # noqa: E402
from dnnctl.tune.ray_fleet import _from_record, _write_sections, tune_on_ray  # noqa: E402
from dnnctl.tune.timer import TimingPolicy  # noqa: E402
from dnnctl.tune.tuner import TuneOptions  # noqa: E402
from dnnctl.workloads import Workload, write_workload  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAST = TimingPolicy.for_backend("numpy").replace(warmup_ms=1.0, budget_ms=4.0,
                                                 retime_budget_ms=2.0, retime_rounds=2)
PROBLEMS = [("softmax", {"rows": 64, "cols": 100, "dtype": "float32"}),
            ("activation", {"fn": "relu", "shape": [4, 1000], "dtype": "float32"}),
            ("layer_norm", {"rows": 32, "cols": 96, "dtype": "float32"})]


@pytest.fixture
def cluster(tmp_path_factory):
    """A local Ray cluster (its start is most of what Ray costs CI); one test uses it, so
    pytest-xdist never starts two."""
    flag = tmp_path_factory.mktemp("ray") / "kill-once"
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "DNNCTL_TEST_KILL_ONCE",
                                            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    os.environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
                      DNNCTL_TEST_KILL_ONCE=str(flag), OMP_NUM_THREADS="1",
                      OPENBLAS_NUM_THREADS="1")
    t0 = time.monotonic()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    print(f"\nray.init: {time.monotonic() - t0:.1f} s")
    try:
        yield flag
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _workload(n: int = len(PROBLEMS)) -> Workload:
    wl = Workload("fleet")
    for op, key in PROBLEMS[:n]:
        wl.add(op, key)
    return wl


def _opts(tmp_path: Path, **kw) -> TuneOptions:
    return TuneOptions(device="cpu", output=tmp_path / "plan.yaml", policy=FAST, max_evals=3,
                       **kw)


def test_fleet_on_a_local_cluster_kill_resume_and_cli(cluster, tmp_path, monkeypatch):
    # 1. a Ray worker is killed while it starts a task: Ray re-runs the task elsewhere
    wl = _workload()  # the registry is loaded here, before the plugin is named
    monkeypatch.setenv("DNNCTL_PLUGINS", "_ray_kill_plugin")
    cluster.write_text("kill the first Ray worker that starts a task\n")
    events = []
    first = tmp_path / "killed"
    report = tune_on_ray(wl, _opts(first), progress=events.append)
    assert not cluster.exists(), "no Ray worker imported the plugin"
    assert [o.status for o in report.outcomes] == ["planned"] * 3
    (section,) = read_plan(first / "plan.yaml").sections
    assert section.device == get_backend("numpy").device(0).fingerprint()
    assert section.tuning["fleet"] == "ray"
    assert {e.problem.op for e in section.entries} == {"softmax", "activation", "layer_norm"}
    assert sum(e.kind == "problem_done" for e in events) == 3
    assert not (first / "plan.yaml.journal").exists()  # complete: journal removed
    monkeypatch.delenv("DNNCTL_PLUGINS")

    # 2. an interrupted run (two problems journaled) resumes: only the third is tuned
    second = tmp_path / "resumed"
    tune_on_ray(_workload(2), _opts(second, keep_journal=True))
    journal = second / "plan.yaml.journal"
    before = len(journal.read_text().splitlines())
    report = tune_on_ray(_workload(3), _opts(second, resume=True, keep_journal=True))
    new = [json.loads(x) for x in journal.read_text().splitlines()[before:]]
    new_done = [r for r in new if r["type"] == "done"]
    assert len(new_done) == 1 and new_done[0]["problem"].startswith("layer_norm")
    assert [o.status for o in report.outcomes] == ["planned"] * 3
    assert len(read_plan(second / "plan.yaml").sections[0].entries) == 3

    # 3. the command line, on the running cluster
    wl_file = tmp_path / "w.yaml"
    write_workload(_workload(1), wl_file)
    res = CliRunner().invoke(app, ["tune", str(wl_file), "--ray", "--device", "cpu",
                                   "--max-evals", "2", "--sample-ms", "2",
                                   "-o", str(tmp_path / "p.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["backend"] == "ray" and out["counts"]["planned"] == 1
    assert json.loads(res.stderr.splitlines()[0])["event"] == "start"


def test_results_are_grouped_into_one_section_per_fingerprint(tmp_path):
    """What a mixed fleet returns (as journal records): two device models, and one node
    with other kernels, make three sections."""
    from dnnctl.plan import kernels_digest

    wl = _workload()
    wl.add("softmax", {"rows": 8, "cols": 8, "dtype": "float32"})
    numpy_fp = get_backend("numpy").device(0).fingerprint()
    other = {**numpy_fp, "name": "Other CPU model"}
    ordered = []
    digests = (kernels_digest(), kernels_digest(), kernels_digest(), "sha256:" + "0" * 64)
    for it, fp, digest in zip(wl.items, (numpy_fp, other, numpy_fp, numpy_fp), digests):
        entry = {"op": it.problem.op, "key": it.problem.as_dict(),
                 "choice": {"variant": "numpy_whole" if it.problem.op == "softmax"
                            else _first_variant(it.problem.op), "params": {}},
                 "stats": {"median_us": 5.0, "p20_us": 4.9, "p80_us": 5.1, "n": 10}}
        ordered.append(_from_record(it, {"status": "planned", "backend": "numpy",
                                         "entry": entry, "fingerprint": fp,
                                         "kernels_digest": digest,
                                         "outcome": {"tried": 2}}))
    notes = _write_sections(tmp_path / "mixed.yaml", ordered, TuneOptions())
    plan = read_plan(tmp_path / "mixed.yaml")
    assert sorted((s.device["name"], s.kernels_digest == kernels_digest(), len(s.entries))
                  for s in plan.sections) == sorted(
        [(numpy_fp["name"], True, 2), ("Other CPU model", True, 1), (numpy_fp["name"], False, 1)])
    assert len(notes) == 3


def _first_variant(op: str) -> str:
    from dnnctl.ops import registry

    for v in registry.variants(op, "numpy"):
        if not v.params:
            return v.name
    raise AssertionError(f"no parameterless numpy variant of {op}")


def test_ray_flag_takes_an_optional_address():
    assert _optional_values(["tune", "w.yaml", "--ray"]) == ["tune", "w.yaml", "--ray="]
    assert _optional_values(["tune", "--ray", "w.yaml"]) == ["tune", "--ray=", "w.yaml"]
    assert _optional_values(["tune", "--ray", "10.0.0.1:6379"]) == [
        "tune", "--ray", "10.0.0.1:6379"]
    assert _optional_values(["tune", "--ray", "--json"]) == ["tune", "--ray=", "--json"]
