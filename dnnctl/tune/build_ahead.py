"""Compiling candidates ahead of their measurement, in helper processes.

NVRTC compiling a tensor-core kernel takes about a second of CPU and measuring it a few
tens of milliseconds, so a serial tuner spends most of its time compiling. Helpers (worker
processes at a lower CPU priority, one CUDA context each) build the candidates the search
is about to ask for; CuPy writes every binary to its on-disk kernel cache, where the
measuring worker finds it. A helper that fails or crashes costs nothing: the measuring
worker then compiles (and judges) the candidate itself.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable

from dnnctl.ops.base import Problem
from dnnctl.tune.candidates import Candidate
from dnnctl.tune.journal import problem_id
from dnnctl.tune.pool import Worker, WorkerLost


def default_helpers(backend: str, devices: int) -> int:
    """Helpers per device: half the cores shared among the devices, at most 8 (GPU only)."""
    if backend != "cupy":
        return 0
    return max(1, min(8, (os.cpu_count() or 2) // (2 * max(1, devices))))


class BuildAhead:
    """A queue of (problem, candidate) builds served by helper processes."""

    def __init__(self, backend: str, device: int, helpers: int, timeout_s: float):
        self.timeout_s = timeout_s
        self.workers = [Worker(backend, device, nice=10) for _ in range(helpers)]
        for w in self.workers:  # spawned by this thread: see Worker.spawn
            w.spawn()
        self._queue: queue.Queue[tuple[int, Problem, Candidate] | None] = queue.Queue()
        self._seen: set[tuple[str, Candidate]] = set()
        self._generation = 0
        self._lock = threading.Lock()
        self._closed = False
        self.built = 0
        self._starting = len(self.workers)  # helpers not yet past their handshake
        self._ready = threading.Event()
        if not self._starting:
            self._ready.set()
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True)
                         for w in self.workers]
        for t in self._threads:
            t.start()

    def submit(self, problem: Problem, candidates: Iterable[Candidate]) -> None:
        """Queue builds (each candidate once per problem) for the current problem."""
        pid = problem_id(problem)
        with self._lock:
            gen = self._generation
            for c in candidates:
                if (pid, c) not in self._seen:
                    self._seen.add((pid, c))
                    self._queue.put((gen, problem, c))

    def next_problem(self) -> None:
        """Drop what is still queued for the previous problem."""
        with self._lock:
            self._generation += 1

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every helper has started (or failed to); True if all are past it."""
        return self._ready.wait(timeout)

    def _started(self) -> None:
        with self._lock:
            self._starting -= 1
            if self._starting <= 0:
                self._ready.set()

    def _serve(self, worker: Worker) -> None:
        try:
            worker.handshake()
        except Exception:  # a helper that cannot start is simply not used
            worker.kill()
            self._started()
            return
        self._started()
        while True:
            item = self._queue.get()
            if item is None:
                return
            gen, problem, cand = item
            if gen != self._generation or self._closed:
                continue
            try:
                worker.request({"cmd": "build", "op": problem.op, "key": problem.as_dict(),
                                "variant": cand.variant, "params": cand.param_dict},
                               self.timeout_s)
                self.built += 1
            except WorkerLost:
                pass  # restarted by the next request
            except Exception:
                return

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for w in self.workers:
            w.kill()
