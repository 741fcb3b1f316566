"""Start a probe's child process early, before doctor has imported the rest of itself.

``dnnctl doctor`` spends ~0.1 s importing its own modules before the probes run; the NVML
child and ``ldconfig -p`` need none of that, so the command line starts them first
(:func:`prestart`) and the probe that would have started the same argv takes the running
process instead (:func:`claim`, used by dnnctl.doctor.host.run_command), under the same time
limit. A child nobody claims within MAX_AGE seconds, or by exit, is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

MAX_AGE = 10.0
_started: dict[tuple[str, ...], tuple[float, subprocess.Popen]] = {}


def popen(argv: Sequence[str]) -> subprocess.Popen:
    """How every probe command is started: no shell, no stdin, its own session."""
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def prestart(argv: Sequence[str]) -> None:
    """Start ``argv`` now for a probe to claim later; failures are left to that probe."""
    key = tuple(str(a) for a in argv)
    if key in _started:
        return
    try:
        _started[key] = (time.monotonic(), popen(key))
    except OSError:
        return
    if len(_started) == 1:
        atexit.register(discard)


def claim(argv: Sequence[str]) -> subprocess.Popen | None:
    """The prestarted process for exactly ``argv``, if one is running and fresh."""
    got = _started.pop(tuple(str(a) for a in argv), None)
    if got is None:
        return None
    started, proc = got
    if time.monotonic() - started > MAX_AGE:
        kill(proc)
        return None
    return proc


def discard() -> None:
    """Kill every prestarted process nobody claimed."""
    while _started:
        _, (_, proc) = _started.popitem()
        kill(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()


def kill(proc: subprocess.Popen) -> None:
    """:func:`kill_group`, then reap the child and close its pipes."""
    kill_group(proc)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc.wait(timeout=1.0)
    for stream in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()


def which(program: str, environ: Mapping[str, str]) -> str | None:
    """The first executable ``program`` on ``environ["PATH"]`` (as Host.which finds it)."""
    for d in environ.get("PATH", "").split(os.pathsep):
        if d and os.access(os.path.join(d, program), os.X_OK):
            return os.path.join(d, program)
    return None
