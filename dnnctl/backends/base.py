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
from dnnctl.errors import BackendUnavailableError, UsageError


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
             flush_l2: bool = True) -> np.ndarray:
        """Run ``fn`` after a time-based warm-up; return per-call times in microseconds."""

    def use_device(self, index: int) -> None:
        """Make ``index`` the current device of this process."""


_BACKENDS: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` ("cupy" or "numpy"); raises if it is unknown."""
    if name not in _BACKENDS:
        if name == "numpy":
            from dnnctl.backends.numpy_backend import NumpyBackend

            _BACKENDS[name] = NumpyBackend()
        elif name == "cupy":
            from dnnctl.backends.cupy_backend import CupyBackend

            _BACKENDS[name] = CupyBackend()
        else:
            raise UsageError(f"unknown backend {name!r}", hint="use 'cupy' or 'numpy'")
    return _BACKENDS[name]


def require_backend(name: str) -> Backend:
    """Like get_backend, but raise BackendUnavailableError with the reason if unusable."""
    backend = get_backend(name)
    ok, reason = backend.availability()
    if not ok:
        raise BackendUnavailableError(
            f"the {name} backend is not usable here: {reason}",
            hint=("install dnnctl[cuda12] or dnnctl[cuda13] on a machine with an NVIDIA GPU, "
                  "or use --device cpu") if name == "cupy" else None,
        )
    return backend


def parse_device(spec: str | None) -> tuple[str, int]:
    """'cuda:1' -> ('cupy', 1); 'cpu' -> ('numpy', 0); None -> best available."""
    if spec is None or spec == "auto":
        ok, _ = get_backend("cupy").availability()
        return ("cupy", 0) if ok else ("numpy", 0)
    text = spec.strip().lower()
    if text in ("cpu", "numpy"):
        return ("numpy", 0)
    if text in ("cuda", "gpu", "cupy"):
        return ("cupy", 0)
    for prefix in ("cuda:", "gpu:"):
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return ("cupy", int(text[len(prefix):]))
    raise UsageError(f"unknown device {spec!r}", hint="use cuda:N, cpu or auto")
