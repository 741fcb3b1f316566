"""Backends behind one small abstract class: ``cupy`` (CUDA) and ``numpy`` (CPU).

The tuner and the dispatcher only talk to :class:`Backend`; they never import CuPy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dnnctl._version import __version__


@dataclass(frozen=True)
class DeviceInfo:
    """What a plan section is keyed by, plus facts kernels need (limits, arch)."""

    backend: str
    index: int
    name: str
    compute_capability: str = ""  # "9.0"; empty on the CPU
    sm_count: int = 0  # multiprocessors (GPU) or logical cores (CPU)
    driver: str = ""
    cuda_runtime: str = ""
    memory_bytes: int = 0
    l2_bytes: int = 0
    smem_per_block_optin: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def cc_tuple(self) -> tuple[int, int]:
        major, _, minor = self.compute_capability.partition(".")
        return (int(major or 0), int(minor or 0))

    def fingerprint(self) -> dict[str, Any]:
        """The fields a plan section records and matches on (see DESIGN.md)."""
        return {
            "backend": self.backend,
            "name": self.name,
            "compute_capability": self.compute_capability,
            "sm_count": self.sm_count,
            "driver": self.driver,
            "cuda_runtime": self.cuda_runtime,
            "dnnctl": __version__,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(ABC):
    """Arrays, devices, timing and synchronization for one kind of device."""

    name: str

    @abstractmethod
    def availability(self) -> tuple[bool, str]:
        """(True, "") when usable here, else (False, reason)."""

    @abstractmethod
    def device(self, index: int = 0) -> DeviceInfo: ...

    @abstractmethod
    def device_count(self) -> int: ...

    @property
    @abstractmethod
    def xp(self) -> Any:
        """The array module (numpy or cupy)."""

    @abstractmethod
    def asarray(self, host: np.ndarray) -> Any:
        """Copy a host array to this backend."""

    @abstractmethod
    def to_numpy(self, arr: Any) -> np.ndarray: ...

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def poison(self, arr: Any) -> None:
        """Fill ``arr`` with a value no kernel writes by accident (NaN for floats)."""
        if np.dtype(arr.dtype).kind == "f" or str(arr.dtype) == "bfloat16":
            arr.fill(np.nan)
        else:
            arr.fill(-1 if np.dtype(arr.dtype).kind == "i" else 0xAB)

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def time(self, fn: Callable[[], None], *, warmup_ms: float = 25.0,
             budget_ms: float = 100.0, min_samples: int = 5, max_samples: int = 2000,
             flush_l2: bool = True, host_ahead: bool = False) -> np.ndarray:
        """Run ``fn`` after a time-based warm-up; return per-call times in microseconds
        (``host_ahead``: the device's time alone, the host enqueueing ahead of it; a backend
        whose host is its device times the call as it is)."""

    def use_device(self, index: int) -> None:
        """Make ``index`` the current device of this process."""
