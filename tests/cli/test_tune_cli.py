"""``dnnctl tune`` through the CLI: the README's first command, JSON, one problem, usage
errors with exit 2, and Ctrl-C (exit 130, resumable)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.plan import read_plan
from dnnctl.tune.timer import TimingPolicy
from dnnctl.workloads import default_workload

runner = CliRunner()


@pytest.fixture(autouse=True)
def _steady_cpu(monkeypatch):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # inherited by the worker processes


def test_tune_with_no_arguments_plans_the_default_workload(tmp_path, monkeypatch):
    """The README's first command: works on a machine without a GPU, writes ./plan.yaml."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "--device", "cpu"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    wl = default_workload("numpy")
    assert f"{len(wl.items)}/{len(wl.items)} problems planned" in res.output
    assert "×default" in res.output and "plan: plan.yaml" in res.output
    plan = read_plan(tmp_path / "plan.yaml")
    assert {e.problem for e in plan.sections[0].entries} == set(wl.problems)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]  # journal cleaned up


def test_one_problem_as_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "--op", "matmul", "--key",
                              "m=96,n=64,k=32,dtype=float32,trans_b=true", "-o", "mm.yaml",
                              "--device", "cpu", "--json", "--strategy", "local"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["schema"] == "dnnctl-tune/1" and out["counts"]["planned"] == 1
    p = out["problems"][0]
    assert p["key"]["trans_b"] is True and p["key"]["m"] == 96
    assert p["winner"]["variant"] in {"numpy", "blocked"} and p["median_us"] > 0
    assert p["tried"] >= 1 and out["strategy"] == "local"
    assert read_plan(tmp_path / "mm.yaml").sections[0].entries[0].problem.as_dict() == p["key"]


def test_gpu_time_is_recorded_in_the_plan_and_refused_on_the_cpu(tmp_path, monkeypatch):
    """--gpu-time (GPU work alone, for plans replayed from CUDA graphs) is a GPU notion: on
    the CPU it is a usage error naming the way out; the plan says how it was timed."""
    monkeypatch.chdir(tmp_path)
    key = ["--op", "softmax", "--key", "rows=64,cols=128,dtype=float32", "--device", "cpu",
           "--max-evals", "2", "--sample-ms", "2"]
    res = runner.invoke(app, ["tune", *key, "--gpu-time"], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert "on the CPU the host is the device" in " ".join(res.output.split())
    assert not (tmp_path / "plan.yaml").exists()
    res = runner.invoke(app, ["tune", *key, "-o", "p.yaml"])
    assert res.exit_code == 0, res.output
    assert read_plan(tmp_path / "p.yaml").sections[0].tuning["host_ahead"] is False
    policy = TimingPolicy().replace(host_ahead=True)
    assert TimingPolicy.from_dict(policy.to_dict()) == policy
    assert policy.plan_metadata()["host_ahead"] is True


@pytest.mark.parametrize("args,words", [
    (["nosuch_model"], "unknown workload 'nosuch_model'"),
    (["resnet50", "--seq", "128"], "has no option 'seq'"),
    (["--op", "matmul"], "--op and --key go together"),
    (["--op", "matmul", "--key", "m=1,n=1"], "key field 'k' is missing"),
    (["--op", "matmul", "--key", "oops"], "is not name=value"),
    (["--strategy", "genetic"], "unknown strategy 'genetic'"),
    (["--device", "tpu:0"], "unknown device 'tpu:0'"),
    (["--devices", "0,x"], "must be GPU indices"),
    (["missing.yaml"], "cannot be read"),
])
def test_usage_errors_exit_2(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", *args], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.output.split())
    assert not (tmp_path / "plan.yaml").exists()


def test_errors_render_as_json_with_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "nosuch_model", "--json"])
    assert res.exit_code == 2
    assert json.loads(res.stdout)["error"]["code"] == "usage"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
def test_ctrl_c_exits_130_and_keeps_the_journal(tmp_path):
    env = dict(os.environ, COLUMNS="200")
    env.pop("DNNCTL_PLUGINS", None)
    proc = subprocess.Popen(
        # --sample-ms: every candidate sampled for 0.2 s, so the run lasts seconds past the
        # second result
        [sys.executable, "-c", "from dnnctl.cli.app import main; main()", "tune", "--device",
         "cpu", "--sample-ms", "200"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        # a shell's background job ignores SIGINT, and a child inherits that: restore it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    journal = None
    while time.time() < deadline and proc.poll() is None:
        found = list(tmp_path.glob("plan.yaml.default-*.journal"))
        if found and found[0].read_text().count('"type":"result"') >= 2:
            journal = found[0]
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "--resume" in err and journal is not None and journal.exists()
    assert str(journal.name) in err.replace("\n", "")
    assert not (tmp_path / "plan.yaml").exists()
