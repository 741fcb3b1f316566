"""``doctor --deep``'s time limit: the framework children get their own per-child limit
(importing torch and starting CUDA take seconds on a GPU host), not the plain probes' 3 s
budget; a child that hangs is still cut off and becomes a finding. Real child processes
(shell scripts standing in for the interpreter), real time limits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.deep import (
    DEEP_TIMEOUT,
    DEEP_TIMEOUT_ENV,
    MARK,
    ask_all,
    resolve_deep_timeout,
    run_deep,
)
from dnnctl.doctor.detect import detect
from dnnctl.doctor.host import Host
from dnnctl.doctor.model import EnvSnapshot, Gpu
from dnnctl.doctor.rules import judge
from dnnctl.errors import UsageError

ANSWER = {"version": "2.4.0+cu124", "cuda": "12.4", "arch_list": ["sm_80", "sm_90"],
          "cudnn": 90100, "cuda_available": True, "device_count": 1,
          "live": {"torch": "2.4.0+cu124", "cudnn": 90100, "launch": {"0": "ok"},
                   "sdpa": {"flash": "ok", "efficient": "ok", "cudnn": "ok"}}}


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _slow_python(tmp_path: Path, seconds: float) -> str:
    """An "interpreter" that answers like the torch child, after ``seconds``."""
    line = MARK + json.dumps(ANSWER)
    return _script(tmp_path / "python-slow", f"sleep {seconds}\nprintf '%s\\n' '{line}'")


def _gpu_env() -> EnvSnapshot:
    return EnvSnapshot(driver={"present": True, "version": "550.54.15"},
                       gpus=[Gpu(0, "NVIDIA H100 80GB HBM3", "9.0")],
                       frameworks={"torch": {"version": "2.4.0+cu124"}})


def test_slow_framework_child_is_not_cut_by_the_plain_budget(tmp_path: Path) -> None:
    # the bug seen on the H200: deep children inherited the plain probes' deadline
    site = tmp_path / "site"
    info = site / "torch-2.4.0+cu124.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.0+cu124\n")
    host = Host(python=_slow_python(tmp_path, 1.2), site_paths=[str(site)], timeout=0.4)
    started = time.monotonic()
    env = detect(host=host, deep=True, budget=0.5, deep_timeout=20)
    assert time.monotonic() - started < 10
    torch = env.frameworks["torch"]
    assert torch["source"] == "deep" and torch["arch_list"] == ["sm_80", "sm_90"], env.notes
    assert not [n for n in env.notes if n.startswith("--deep")], env.notes


def test_ask_all_ignores_an_expired_plain_deadline(tmp_path: Path) -> None:
    host = Host(python=_slow_python(tmp_path, 0.3), deadline=time.monotonic() - 1)
    data, failure = ask_all(host, ["torch"], timeout=20)["torch"]
    assert failure is None and data["arch_list"] == ["sm_80", "sm_90"]


def test_hung_torch_child_is_cut_off_and_becomes_a_finding(tmp_path: Path) -> None:
    hang = _script(tmp_path / "python-hangs", "sleep 60")
    env = _gpu_env()
    started = time.monotonic()
    run_deep(Host(python=hang), env, timeout=1.0)
    assert time.monotonic() - started < 4
    assert "timed out after 1 s" in env.live["error"]
    assert DEEP_TIMEOUT_ENV in env.live["error"]  # says how to give it longer
    failed = [f for f in judge(env, load_matrix()) if f.code == "live-failed"]
    assert failed and "timed out" in failed[0].message, failed


def test_children_run_in_parallel_so_the_total_is_one_limit(tmp_path: Path) -> None:
    hang = _script(tmp_path / "python-hangs", "sleep 60")
    env = _gpu_env()
    env.frameworks.update(jax={"version": "0.4.30"}, cupy={"version": "13.3.0"})
    started = time.monotonic()
    run_deep(Host(python=hang), env, timeout=1.0)
    assert time.monotonic() - started < 3.5
    assert sum("--deep " in n and "timed out" in n for n in env.notes) == 3
    codes = [f.code for f in judge(env, load_matrix())]
    assert codes.count("probe-failed") == 2 and "live-failed" in codes  # jax, cupy; torch


def test_crashing_torch_child_is_a_finding_not_missing_keys(tmp_path: Path) -> None:
    crash = _script(tmp_path / "python-crashes", "echo 'Fatal Python error' >&2; kill -SEGV $$")
    env = _gpu_env()
    run_deep(Host(python=crash), env, timeout=10)
    assert "exited with status -11" in env.live["error"], env.live
    assert any(f.code == "live-failed" for f in judge(env, load_matrix()))


def test_torch_that_sees_no_gpu_on_a_gpu_host_is_a_finding(tmp_path: Path) -> None:
    answer = {"version": "2.4.0+cu124", "cuda": "12.4", "arch_list": ["sm_90"],
              "cuda_available": False}
    py = _script(tmp_path / "python", f"printf '%s\\n' '{MARK + json.dumps(answer)}'")
    env = _gpu_env()
    run_deep(Host(python=py), env, timeout=10)
    assert "is_available() is False" in env.live["error"]
    assert env.frameworks["torch"]["arch_list"] == ["sm_90"]


def test_no_live_error_without_a_gpu(tmp_path: Path) -> None:
    hang = _script(tmp_path / "python-hangs", "sleep 60")
    env = EnvSnapshot(driver={"present": False}, frameworks={"torch": {"version": "2.4.0"}})
    run_deep(Host(python=hang), env, timeout=0.5)
    assert env.live == {} and any("timed out" in n for n in env.notes)
    failed = [f for f in judge(env, load_matrix()) if f.code == "probe-failed"]
    assert failed and "--deep torch: timed out" in failed[0].message


def test_limit_from_argument_environment_or_default() -> None:
    assert resolve_deep_timeout(None, {}) == DEEP_TIMEOUT
    assert resolve_deep_timeout(None, {DEEP_TIMEOUT_ENV: " 150 "}) == 150.0
    assert resolve_deep_timeout("7.5", {DEEP_TIMEOUT_ENV: "150"}) == 7.5
    for bad in ("0", "-1", "abc", "nan", "inf", "1e400", "9" * 4300):
        with pytest.raises(UsageError, match="--deep-timeout"):
            resolve_deep_timeout(bad, {})
    with pytest.raises(UsageError, match=DEEP_TIMEOUT_ENV):
        resolve_deep_timeout(None, {DEEP_TIMEOUT_ENV: "soon"})
