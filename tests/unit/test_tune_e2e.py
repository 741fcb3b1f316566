"""End to end on the numpy backend with real worker subprocesses: tune -> plan -> load ->
dispatch with the real numpy conv2d variants; resume after SIGKILL; crashing, segfaulting,
hanging, wrong and out-of-memory candidates survived (test plugin, loaded only into
subprocesses); pins, budgets and parallel workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dnnctl
from dnnctl.ops import registry
from dnnctl.plan import read_plan, write_plan
from dnnctl.plan.pin import pin
from dnnctl.tune.timer import TimingPolicy
from dnnctl.tune.tuner import TuneOptions, tune
from dnnctl.workloads import Workload, write_workload

HERE = Path(__file__).resolve().parent
FAST = TimingPolicy.for_backend("numpy").replace(warmup_ms=1.0, budget_ms=8.0,
                                                 retime_budget_ms=5.0)
BIG_FILTER = {"n": 1, "c": 4, "h": 40, "w": 40, "k": 8, "r": 11, "s": 11, "pad": 5,
              "dtype": "float32", "layout": "NCHW"}
DEPTHWISE = {"n": 2, "c": 64, "h": 28, "w": 28, "k": 64, "r": 3, "s": 3, "pad": 1, "groups": 64,
             "dtype": "float32", "layout": "NCHW"}


@pytest.fixture(autouse=True)
def _single_threaded_blas(monkeypatch):
    """Workers inherit this: one BLAS thread keeps CPU timings steady on a busy 2-core box."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")


def _opts(tmp_path: Path, **kw) -> TuneOptions:
    return TuneOptions(device="cpu", output=tmp_path / "plan.yaml", policy=FAST, **kw)


def _cli(args: list[str], cwd: Path, **popen) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]), COLUMNS="200")
    env.pop("DNNCTL_PLUGINS", None)
    return subprocess.Popen([sys.executable, "-c", "from dnnctl.cli.app import main; main()",
                             *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def test_tune_plan_load_dispatch(tmp_path):
    wl = Workload("e2e")
    big = wl.add("conv2d", BIG_FILTER)
    dw = wl.add("conv2d", DEPTHWISE, count=2)
    report = tune(wl, _opts(tmp_path))
    assert [o.status for o in report.outcomes] == ["planned", "planned"]
    assert not Path(report.journal_path).exists()  # complete: the journal is cleaned up
    plan = read_plan(tmp_path / "plan.yaml")
    sec = plan.sections[0]
    assert sec.device["backend"] == "numpy" and sec.tuning["strategy"] == "auto"
    e_big, e_dw = sec.find(big), sec.find(dw)
    n_variants = {v.name for v in registry.variants("conv2d", "numpy") if "forward" in v.passes}
    # the algorithms really differ here (several-fold): FFT wins the 11x11 filter, direct
    # the depthwise conv; every entry records a slower runner-up (no timed assertion)
    assert e_big.choice.variant == "fft" and e_dw.choice.variant == "direct"
    for e in (e_big, e_dw):
        assert e.runner_up is not None and e.runner_up.choice != e.choice
        assert e.runner_up.median_us >= e.stats.median_us * (1 - FAST.tie_cap)
        assert e.default is not None and e.stats.p20_us <= e.stats.median_us <= e.stats.p80_us
    assert e_dw.tried >= len(n_variants) and e_dw.max_rel_err < 1e-5
    assert sum(e_dw.failed.values()) == 0 and e_dw.stats.n >= 3
    loaded = dnnctl.load_plan(str(tmp_path / "plan.yaml"), device="cpu", strict=True)
    op = registry.get_op("conv2d")
    rng = np.random.default_rng(0)
    ins = op.make_inputs(dw, rng)
    y = dnnctl.ops.conv2d(ins["x"], ins["w"], padding=1, groups=64, plan=loaded)
    ref = op.reference(dw, {k: v.astype(np.float64) for k, v in ins.items()}, {})["y"]
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5
    assert loaded.stats().hits == {dw: 1}


def _workers_of(leader: int) -> list[int]:
    """Pids of tuning workers started by ``leader`` (they carry --parent <pid>)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"dnnctl.tune.worker" in argv and str(leader).encode() in argv:
                out.append(int(d.name))
    return out


def _results(journal: Path) -> list[tuple[str, str, str]]:
    rows = []
    for line in journal.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") == "result":
            rows.append((r["problem"], r["variant"], json.dumps(r["params"], sort_keys=True)))
    return rows


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and SIGKILL")
def test_resume_after_sigkill(tmp_path):
    wl = Workload("resume")
    for c in (4, 6, 8, 10, 12, 14):
        wl.add("conv2d", {**DEPTHWISE, "c": c, "k": c, "groups": c, "h": 20, "w": 20})
    write_workload(wl, tmp_path / "wl.yaml")
    args = ["tune", "wl.yaml", "-o", "plan.yaml", "--device", "cpu", "--keep-journal",
            "--sample-ms", "10"]
    proc = _cli(args, tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        found = sorted(tmp_path.glob("plan.yaml.resume-*.journal"))
        if found and len(_results(found[0])) >= 5:
            journal = found[0]
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    workers = _workers_of(proc.pid)
    assert workers, "the leader should have a worker subprocess"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    for _ in range(200):  # the workers die with their leader (PR_SET_PDEATHSIG)
        if not any(Path(f"/proc/{w}").exists() and "Z" not in _state(w) for w in workers):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"orphaned workers {workers}")
    before = _results(journal)
    assert len(before) >= 5 and not (tmp_path / "plan.yaml").exists()
    proc = _cli([*args, "--resume", "--json"], tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["counts"]["planned"] == 6
    after = _results(journal)
    assert after[: len(before)] == before
    assert len(after) == len(set(after)), "a measured candidate was measured again"
    assert len(read_plan(tmp_path / "plan.yaml").sections[0].entries) == 6


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


def test_crashing_hanging_wrong_and_oom_candidates_are_survived(tmp_path):
    args = ["tune", "--op", "toy_scale", "--key", "n=200000", "--plugin", "_tune_plugin",
            "--device", "cpu", "--candidate-timeout", "3", "--json", "--sample-ms", "10"]
    proc = _cli(args, tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    p = json.loads(out)["problems"][0]
    assert p["status"] == "planned" and p["tried"] == 9
    assert p["failed"] == {"wrong": 1, "crashed": 2, "timeout": 1, "oom": 1}
    assert p["winner"]["variant"] == "atomic"  # the fastest survivor (4x faster than 'fast')
    assert p["default"]["variant"] == "slow" and p["speedup_vs_default"] > 2
    text = (tmp_path / "plan.yaml").read_text()
    assert '"failed": {"wrong": 1, "crashed": 2, "timeout": 1, "oom": 1}' in text
    # --deterministic drops the non-deterministic winner; the search order keeps the default
    proc = _cli([*args[:-2], "--deterministic", "--max-evals", "3", "-o", "det.yaml"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    p = json.loads(out)["problems"][0]
    assert p["winner"] == {"variant": "fast", "params": {"reps": 4}}
    assert "atomic" in p["skipped"] and "non-deterministic" in p["skipped"]["atomic"]


def test_budget_zero_starts_nothing_and_says_so(tmp_path):
    wl = Workload("budget")
    wl.add("conv2d", BIG_FILTER)
    wl.add("matmul", {"m": 64, "n": 64, "k": 64, "dtype": "float32"})
    report = tune(wl, _opts(tmp_path, budget_s=0.0))
    for o in report.outcomes:  # a hard wall: the budget was gone before the first problem
        assert o.status == "unplanned" and o.tried == 0
        assert o.detail == "not started: the --budget ran out"
    assert not (tmp_path / "plan.yaml").exists()
    assert Path(report.journal_path).exists()  # --resume continues from it


def test_pins_other_sections_and_resume_are_respected(tmp_path):
    path = tmp_path / "plan.yaml"
    wl = Workload("pins")
    a = wl.add("conv2d", BIG_FILTER)
    tune(wl, _opts(tmp_path))
    pin(path, "conv2d", BIG_FILTER, variant="direct", params={"order": "image"})
    plan = read_plan(path)
    other = plan.sections[0].__class__(dict(plan.sections[0].device, name="Another CPU"),
                                       plan.sections[0].kernels_digest, "x", {}, [])
    plan.sections.append(other)
    write_plan(plan, path)
    b = wl.add("conv2d", {**BIG_FILTER, "n": 2})
    report = tune(wl, _opts(tmp_path))
    assert [o.status for o in report.outcomes] == ["pinned", "planned"], [
        (o.status, o.detail) for o in report.outcomes]
    plan = read_plan(path)
    assert [s.device["name"] for s in plan.sections][1] == "Another CPU"
    mine = plan.sections[0]
    assert mine.find(a).pinned and mine.find(a).choice.variant == "direct"
    assert not mine.find(b).pinned and mine.find(b).tried >= 4
    again = tune(wl, _opts(tmp_path, resume=True))  # already planned: nothing re-measured
    assert [o.status for o in again.outcomes] == ["pinned", "kept"]


def test_parallel_workers_share_the_queue_and_merge(tmp_path):
    wl = Workload("slots")
    for n in (1, 2, 3, 4):
        wl.add("conv2d", {**BIG_FILTER, "n": n, "h": 24, "w": 24})
    report = tune(wl, _opts(tmp_path, _slots=(0, 0), build_helpers=1, strategy="exhaustive"))
    assert {o.slot for o in report.outcomes} == {0, 1}
    assert report.prebuilt >= 4  # build helpers compiled ahead (a no-op build on numpy)
    assert all(o.status == "planned" for o in report.outcomes)
    plan = read_plan(tmp_path / "plan.yaml")
    assert len(plan.sections) == 1 and {e.problem for e in plan.sections[0].entries} == set(
        wl.problems)


def test_bad_usage_is_reported_before_any_work(tmp_path):
    from dnnctl.errors import PlanError, UsageError

    wl = Workload("x")
    wl.add("conv2d", BIG_FILTER)
    with pytest.raises(UsageError, match="unknown strategy"):
        tune(wl, _opts(tmp_path, strategy="genetic"))
    with pytest.raises(UsageError, match="nothing to tune"):
        tune(wl, _opts(tmp_path, ops=("softmax",)))
    with pytest.raises(UsageError, match="device 1 does not exist"):
        tune(wl, _opts(tmp_path, devices=(0, 1)))
    (tmp_path / "plan.yaml").write_text("schema: dnnctl-plan/1\nsections: 3\n")
    with pytest.raises(PlanError, match="field 'sections'"):
        tune(wl, _opts(tmp_path))


def test_a_budgeted_run_takes_the_heaviest_problems_first(tmp_path):
    """Under --budget the queue runs by weight (calls per step x roofline floor), so a run
    cut short has planned the problems that decide the step's time; without a budget the
    workload's order is kept. The plan lists the problems in the workload's order either
    way."""
    from dnnctl.tune.tuner import problem_weight

    wl = Workload("weights")
    small = wl.add("layer_norm", {"rows": 8, "cols": 64, "dtype": "float32"})
    heavy = wl.add("conv2d", BIG_FILTER, count=4)
    mid = wl.add("matmul", {"m": 64, "n": 64, "k": 64, "dtype": "float32"}, count=2)
    weights = {it.problem.op: problem_weight(it) for it in wl.items}
    assert weights["conv2d"] > weights["matmul"] > weights["layer_norm"]
    order: list[str] = []

    def progress(event):
        if event.kind == "problem_done" and event.data.get("outcome") is not None:
            order.append(event.data["outcome"].problem.op)

    report = tune(wl, _opts(tmp_path, budget_s=0.0), progress)
    assert order == ["conv2d", "matmul", "layer_norm"]
    assert [o.problem for o in report.outcomes] == [small, heavy, mid]
