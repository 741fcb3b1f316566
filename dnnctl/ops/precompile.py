"""Compile the kernels a set of builds needs, in parallel, before anything runs.

NVRTC takes about a second per tensor-core module and one CPU core; a test run or benchmark
that builds hundreds of candidates one after the other spends minutes compiling. Here the
builds are first *recorded* (each variant's ``build()`` runs against a stand-in backend that
only notes which modules it compiles), then the modules are compiled by a process pool into
CuPy's on-disk kernel cache, where the real builds find them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

Job = tuple[str, tuple[tuple[str, Any], ...], tuple[str, ...]]  # source, defines, names


class CompileRecorder:
    """Stands in for the cupy backend (and the conv2d runtime) and records each module."""

    name = "cupy"

    def __init__(self) -> None:
        import numpy as np

        self.xp = np
        self.jobs: dict[Job, None] = {}

    def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                       name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                       device: int | None = None) -> Any:
        self.jobs[(source, tuple(sorted((defines or {}).items())),
                   tuple(name_expressions))] = None
        return _Module()

    # the conv2d runtime's interface (dnnctl/ops/conv2d/_cuda.py)
    def function(self, source: str, defines: Mapping[str, Any], name: str) -> Any:
        return self.compile_module(source, defines=defines).get_function(name)

    def fft_plan(self, *args: Any) -> None:
        return None

    def ptr(self, arr: Any) -> int:
        return 0


class _Function:
    max_dynamic_shared_size_bytes = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Module:
    @staticmethod
    def get_function(name: str) -> _Function:
        return _Function()


@contextlib.contextmanager
def recording() -> Iterator[CompileRecorder]:
    """Inside the block every cupy build compiles nothing and is recorded instead."""
    from dnnctl.backends import registry as base
    from dnnctl.ops.conv2d import _cuda

    rec = CompileRecorder()
    saved = base._BACKENDS.get("cupy")
    base._BACKENDS["cupy"] = rec  # type: ignore[assignment]
    try:
        with _cuda.use_runtime(rec):
            yield rec
    finally:
        if saved is None:
            base._BACKENDS.pop("cupy", None)
        else:
            base._BACKENDS["cupy"] = saved


def record_builds(builds: Iterable[tuple[Any, Any, Mapping[str, Any]]], device: Any) -> list[Job]:
    """The modules that ``variant.build(problem, params, device)`` compiles for each build,
    in first-use order. A build that fails here is skipped: the real build reports it."""
    with recording() as rec:
        for variant, problem, params in builds:
            try:
                variant.build(problem, dict(params), device)
            except Exception:
                pass
    return list(rec.jobs)


def compile_job(job: Job) -> str | None:
    """Compile one recorded module (in a pool process); the error text if it fails."""
    from dnnctl.backends.registry import get_backend

    source, defines, names = job
    try:
        get_backend("cupy").compile_module(source, defines=dict(defines),
                                           name_expressions=names)
    except Exception as exc:  # the real build of that candidate reports it properly
        return f"{source}: {type(exc).__name__}: {exc}"
    return None


def default_workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))


def compile_jobs(jobs: Sequence[Job], *, workers: int | None = None,
                 timeout_s: float | None = None) -> tuple[int, list[str]]:
    """Compile ``jobs`` with a spawn-context process pool: (modules done, failures).

    Stops waiting after ``timeout_s`` (what is left compiles on first use)."""
    import concurrent.futures as cf
    import multiprocessing

    done, failed = 0, []
    pool = cf.ProcessPoolExecutor(max_workers=workers or default_workers(),
                                  mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(compile_job, j) for j in jobs]
        for fut in cf.as_completed(futures, timeout=timeout_s):
            done += 1
            err = fut.result()
            if err is not None:
                failed.append(err)
    except cf.TimeoutError:
        pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return done, failed
