"""The backend registry: ``cupy`` (CUDA) and ``numpy`` (CPU) by name, made once each.

Kept apart from :mod:`dnnctl.backends.base` so that the implementations import the base
classes and nothing imports back up.
"""

from __future__ import annotations

from dnnctl.backends.base import Backend
from dnnctl.errors import BackendUnavailableError, UsageError

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
