"""Plans and journals under concurrency: locked read-modify-writes lose nothing.

Real processes, real locks: ``dnnctl plan merge`` runs as separate OS processes (forked
from this one, so 100 of them cost no interpreter start-up; one round runs fresh
interpreters too), all released at once into one output file; merges run in a loop while a
real tune (with its worker subprocess) writes the same plan. Every section must survive.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _plan_helpers import conv, entry, numpy_section

import dnnctl.api  # noqa: F401 - imported once here, not in each forked merge process
import dnnctl.plan.compare  # noqa: F401
from dnnctl.cli.app import app
from dnnctl.errors import DnnctlError
from dnnctl.files.locking import LockedError, holder, lock_paths, path_lock
from dnnctl.files.yamlio import write_atomic
from dnnctl.plan import Plan, read_plan, write_plan
from dnnctl.tune.timer import TimingPolicy
from dnnctl.tune.tuner import TuneOptions, tune
from dnnctl.workloads import Workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FAST = TimingPolicy.for_backend("numpy").replace(warmup_ms=0.5, budget_ms=2.0,
                                                 retime_budget_ms=1.0, retime_rounds=1)
FORK = mp.get_context("fork") if sys.platform.startswith("linux") else None
needs_fork = pytest.mark.skipif(FORK is None, reason="uses fork() to start merge processes")


def _plan_of(name: str, n: int) -> Plan:
    """A plan with one section of a device called ``name`` and ``n`` entries."""
    return Plan([numpy_section([entry(conv(n=i + 1), "direct", {"order": "image"}, 50.0 + i)
                                for i in range(n)], name=name)])


def _merge_child(args: list[str], start: object, cwd: str) -> None:
    """One forked merge process: wait for the start signal, run the real CLI, exit."""
    os.chdir(cwd)
    start.wait(30)  # type: ignore[attr-defined]
    try:
        app(args, standalone_mode=False)
        code = 0
    except DnnctlError:
        code = 3
    except BaseException:  # noqa: BLE001 - any other failure is a test failure
        code = 4
    os._exit(code)


def _run_merges(tmp: Path, out: Path, sources: list[Path]) -> list[int]:
    start = FORK.Event()
    procs = [FORK.Process(target=_merge_child, args=(
        ["plan", "merge", str(out), str(src), "-o", str(out), "--json"], start, str(tmp)))
        for src in sources]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    return [p.exitcode for p in procs]


@needs_fork
def test_ten_concurrent_merges_into_one_file_lose_nothing_10_of_10(tmp_path):
    sources = []
    for i in range(10):
        src = tmp_path / f"p{i}.yaml"
        write_plan(_plan_of(f"CPU {i}", 2), src)
        sources.append(src)
    for rep in range(10):
        out = tmp_path / f"out{rep}.yaml"
        write_plan(_plan_of("base", 3), out)
        codes = _run_merges(tmp_path, out, sources)
        assert codes == [0] * 10, (rep, codes)
        plan = read_plan(out)
        names = sorted(s.device["name"] for s in plan.sections)
        assert names == sorted(["base", *(f"CPU {i}" for i in range(10))]), (rep, names)
        assert sum(len(s.entries) for s in plan.sections) == 3 + 10 * 2
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


def test_concurrent_merges_as_fresh_interpreters(tmp_path):
    out = tmp_path / "out.yaml"
    write_plan(_plan_of("base", 1), out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    procs = []
    for i in range(4):  # fresh interpreters cost a second each on a small CI box
        src = tmp_path / f"p{i}.yaml"
        write_plan(_plan_of(f"CPU {i}", 1), src)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "from dnnctl.cli.app import main; main()", "plan", "merge",
             str(out), str(src), "-o", str(out)], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert len(read_plan(out).sections) == 5


def _merge_loop(out: str, other: str, stop: object, cwd: str) -> None:
    os.chdir(cwd)
    code = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        try:
            app(["plan", "merge", out, other, "-o", out, "--json"], standalone_mode=False)
        except BaseException:  # noqa: BLE001
            code = 4
            break
    os._exit(code)


@needs_fork
def test_merges_during_a_running_tune_lose_nothing_10_of_10(tmp_path, monkeypatch):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    other = tmp_path / "other.yaml"
    write_plan(_plan_of("Another CPU", 2), other)
    wl = Workload("during")
    for c in (4, 8):
        wl.add("conv2d", {"n": 1, "c": c, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3, "pad": 1,
                          "dtype": "float32", "layout": "NCHW"})
    for rep in range(10):
        out = tmp_path / f"plan{rep}.yaml"
        write_plan(_plan_of("Third CPU", 1), out)
        stop = FORK.Event()
        merger = FORK.Process(target=_merge_loop, args=(str(out), str(other), stop,
                                                        str(tmp_path)))
        merger.start()
        try:
            report = tune(wl, TuneOptions(device="cpu", output=out, policy=FAST,
                                          strategy="exhaustive", max_evals=3))
        finally:
            stop.set()
            merger.join(60)
        assert merger.exitcode == 0
        plan = read_plan(out)
        names = {s.device["name"] for s in plan.sections}
        assert {"Another CPU", "Third CPU"} <= names, (rep, names)
        mine = plan.section_for(report.device)
        assert mine is not None and {e.problem for e in mine.entries} == set(wl.problems)


def test_a_writer_that_cannot_get_the_lock_says_who_holds_it(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(_plan_of("base", 1), path)
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with path_lock(path, purpose="test"):
            started.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    started.wait(10)
    try:
        info = holder(path)
        assert info is not None and info["pid"] == os.getpid() and info["host"]
        with pytest.raises(LockedError) as exc, path_lock(path, timeout=0.3):
            pass
        text = str(exc.value)
        assert f"pid {os.getpid()} on " in text and str(path) in text and exc.value.hint
    finally:
        release.set()
        t.join()
    _, lock_file, info_file = lock_paths(path)
    assert not lock_file.exists() and not info_file.exists()  # nothing left behind


def test_temp_files_of_a_killed_writer_are_swept_by_the_next_one(tmp_path):
    path = tmp_path / "plan.yaml"
    orphan = tmp_path / ".plan.yaml.k1_x9zq2.tmp"  # what mkstemp left when kill -9 hit
    orphan.write_text("half a plan")
    other = tmp_path / ".plan.yaml.bak.abcdefgh.tmp"  # another file's temp: not ours
    other.write_text("x")
    write_plan(_plan_of("base", 1), path)
    assert not orphan.exists() and other.exists()
    assert read_plan(path).sections[0].device["name"] == "base"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL")
def test_kill_9_during_an_atomic_write_leaves_the_old_plan_and_no_temp_file(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(_plan_of("base", 1), path)
    code = ("import os, sys\n"
            "from dnnctl.files.yamlio import write_atomic, file_lock\n"
            "import dnnctl.files.yamlio as y\n"
            "real = os.replace\n"
            "def stuck(*a):\n"
            "    print('writing', flush=True); import time; time.sleep(60)\n"
            "y.os.replace = stuck\n"
            f"with file_lock({str(path)!r}):\n"
            f"    write_atomic({str(path)!r}, 'garbage')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert list(tmp_path.glob(".plan.yaml.*.tmp"))
    proc.kill()
    proc.wait(10)
    assert read_plan(path).sections[0].device["name"] == "base"  # the old plan, whole
    write_atomic(tmp_path / "unrelated.yaml", "x: 1\n")
    write_plan(_plan_of("next", 1), path)  # the next writer sweeps the orphan
    assert not list(tmp_path.glob(".plan.yaml.*.tmp"))
    deadline = time.time() + 5
    while time.time() < deadline and lock_paths(path)[2].exists():
        time.sleep(0.05)
    assert not lock_paths(path)[2].exists()
