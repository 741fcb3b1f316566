"""The CPU backend: NumPy arrays, wall-clock timing. Real, not a mock: it runs the numpy
variants so that tune -> plan -> dispatch works on a machine without a GPU."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np

from dnnctl.backends.base import Backend, DeviceInfo

_FLUSH_BYTES = 64 << 20  # larger than any CPU last-level cache we expect


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class NumpyBackend(Backend):
    name = "numpy"

    def availability(self) -> tuple[bool, str]:
        return True, ""

    def device_count(self) -> int:
        return 1

    @cached_property
    def _device(self) -> DeviceInfo:
        return DeviceInfo(
            backend="numpy", index=0, name=_cpu_name(), compute_capability="",
            sm_count=os.cpu_count() or 1, driver="", cuda_runtime=f"numpy {np.__version__}",
        )

    def device(self, index: int = 0) -> DeviceInfo:
        return self._device

    @property
    def xp(self) -> Any:
        return np

    def asarray(self, host: np.ndarray) -> Any:
        return np.array(host, copy=True)

    def to_numpy(self, arr: Any) -> np.ndarray:
        return np.asarray(arr)

    def synchronize(self) -> None:
        return None

    @cached_property
    def _flush_buf(self) -> np.ndarray:
        return np.empty(_FLUSH_BYTES, dtype=np.uint8)

    def time(self, fn: Callable[[], None], *, warmup_ms: float = 25.0,
             budget_ms: float = 100.0, min_samples: int = 5, max_samples: int = 2000,
             flush_l2: bool = True, host_ahead: bool = False) -> np.ndarray:
        deadline = time.perf_counter() + warmup_ms / 1e3
        fn()  # at least one warm-up call
        while time.perf_counter() < deadline:
            fn()
        samples: list[float] = []
        end = time.perf_counter() + budget_ms / 1e3
        while len(samples) < max_samples and (
                len(samples) < min_samples or time.perf_counter() < end):
            if flush_l2:
                self._flush_buf.fill(len(samples) & 0xFF)
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return np.asarray(samples)
