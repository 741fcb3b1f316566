"""Run a probe on its own thread: ``task = Task(fn, *args)`` ... ``task.result()``.

concurrent.futures imports logging (~10 ms of doctor's start-up) for what is, here, a
thread and a join. The threads are daemons, so a probe that never returns cannot keep the
process alive after doctor has given up on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Task(Generic[T]):
    """``fn(*args)`` started now on a daemon thread."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # handed to whoever waits for the result
            self._error = exc

    def result(self) -> T:
        """Wait for ``fn`` and return what it returned (or raise what it raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
