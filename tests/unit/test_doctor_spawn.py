"""Probe children started early (before doctor's imports) are taken over by the probe that
runs the same command, under its time limit; one nobody takes is killed. Real processes."""

from __future__ import annotations

import os
import sys
import time

from dnnctl.doctor import spawn
from dnnctl.doctor.host import run_command


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_prestarted_child_is_claimed_with_its_output() -> None:
    argv = [sys.executable, "-I", "-S", "-c", "import os; print(os.getpid())"]
    spawn.prestart(argv)
    pid = spawn._started[tuple(argv)][1].pid
    time.sleep(0.2)  # it already ran while "doctor imported itself"
    res = run_command(argv, 5)
    assert res is not None and res.ok and int(res.stdout) == pid
    assert tuple(argv) not in spawn._started  # used once


def test_prestarted_hung_child_is_still_cut_off() -> None:
    argv = ["sleep", "60"]
    spawn.prestart(argv)
    started = time.monotonic()
    res = run_command(argv, 0.5)
    assert res is not None and "timed out" in (res.error or "")
    assert time.monotonic() - started < 2


def test_unclaimed_or_stale_children_are_killed(monkeypatch) -> None:
    spawn.prestart(["sleep", "61"])
    pid = spawn._started[("sleep", "61")][1].pid
    spawn.discard()
    assert not spawn._started and not _alive(pid)
    spawn.prestart(["sleep", "62"])
    pid = spawn._started[("sleep", "62")][1].pid
    monkeypatch.setattr(spawn, "MAX_AGE", 0.0)
    assert spawn.claim(["sleep", "62"]) is None and not _alive(pid)


def test_which_matches_path_order(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "tool").write_text("#!/bin/sh\n")
        (d / "tool").chmod(0o755)
    assert spawn.which("tool", {"PATH": f"{b}:{a}"}) == str(b / "tool")
    assert spawn.which("tool", {"PATH": ""}) is None
