"""Leader side of the worker subprocesses: start, ask with a timeout, kill, restart.

A request that times out kills the worker (SIGKILL) and reports ``timeout``; a worker that
dies mid-request (segfault, ``os._exit``, an illegal address that poisoned its CUDA
context) reports ``crashed`` with the signal and the tail of its stderr. The next request
starts a fresh worker, which must be re-``prepare``d (the handle remembers for what).
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from dnnctl.errors import BackendUnavailableError, UsageError


class WorkerLost(Exception):
    """The worker died or hung; ``status`` is 'crashed' or 'timeout'."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Worker:
    """One worker subprocess bound to one device."""

    def __init__(self, backend: str, device: int, *, start_timeout: float = 180.0,
                 env: dict[str, str] | None = None, nice: int = 0):
        self.backend = backend
        self.device = device
        self.nice = nice
        self.start_timeout = start_timeout
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        self.prepared: str | None = None  # id of the problem the worker holds
        self.restarts = 0
        self._buf = b""
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> dict[str, Any]:
        """Start the process and return its hello (device facts)."""
        self.spawn()
        return self.handshake()

    def spawn(self) -> None:
        """Start the process. Linux kills a worker when the *thread* that spawned it exits
        (PR_SET_PDEATHSIG), so spawn from the thread that outlives the worker's use."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, "-m", "dnnctl.tune.worker", "--backend", self.backend,
               "--device", str(self.device), "--parent", str(os.getpid())]
        if self.nice:
            cmd += ["--nice", str(self.nice)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, close_fds=True)
        self._buf = b""
        self._stderr.clear()
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        self.prepared = None

    def handshake(self) -> dict[str, Any]:
        """Wait for the worker to be ready (any thread may do this)."""
        try:
            hello = self._ask({"cmd": "hello"}, self.start_timeout)
        except WorkerLost as exc:
            raise BackendUnavailableError(
                f"the tuning worker for {self.backend}:{self.device} did not start "
                f"({exc.status}): {exc.detail}",
                hint="run 'dnnctl doctor'; DNNCTL_DEBUG=1 shows more") from None
        if hello.get("status") != "ok":
            self.kill()
            raise BackendUnavailableError(
                f"the tuning worker for {self.backend}:{self.device} cannot run: "
                f"{hello.get('detail')}", hint="run 'dnnctl doctor'")
        self.hello = hello
        return hello

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self.start()

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        self.prepared = None
        if proc is None:
            return
        try:
            proc.kill()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.write(b'{"cmd": "exit"}\n')
                proc.stdin.flush()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        self.kill()

    # ------------------------------------------------------------------ requests

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``msg``; the reply, or WorkerLost (the worker is then gone)."""
        self.ensure()
        return self._ask(msg, timeout)

    def _ask(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        with self._lock:
            try:
                proc.stdin.write((json.dumps(msg) + "\n").encode())
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._lost("crashed", "the worker exited before the request") from None
            line = self._read_line(proc, time.monotonic() + timeout)
        try:
            reply = json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerLost("crashed", f"garbled reply from the worker: {line[:200]!r}"
                             ) from None
        if reply.get("fatal"):
            # the worker exits by itself after a fatal error; reap it
            self.kill()
        return reply

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._lost("timeout", "no answer within the time limit")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._lost("crashed", "the worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _lost(self, status: str, what: str) -> WorkerLost:
        proc = self.proc
        if status == "timeout":
            self.kill()
            return WorkerLost("timeout", what)
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        time.sleep(0.05)  # let the stderr drain thread catch the last lines
        tail = " | ".join(line for line in list(self._stderr)[-6:] if line.strip())
        self.kill()
        how = _exit_text(code)
        detail = f"{what} ({how})" + (f": {tail}" if tail else "")
        return WorkerLost(status, detail[:1500])

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        stream = proc.stderr
        if stream is None:
            return
        try:
            for raw in iter(stream.readline, b""):
                self._stderr.append(raw.decode("utf-8", "replace").rstrip())
        except (OSError, ValueError):
            pass

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running, killed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def check_identical(hellos: list[dict[str, Any]]) -> None:
    """--devices needs identical GPUs: one plan section covers all of them."""
    first = hellos[0]["fingerprint"]
    for h in hellos[1:]:
        if h["fingerprint"] != first:
            raise UsageError(
                f"--devices needs identical devices: {first.get('name')} vs "
                f"{h['fingerprint'].get('name')} ({h['fingerprint']})",
                hint="tune each kind of GPU separately and 'dnnctl plan merge' the plans")
