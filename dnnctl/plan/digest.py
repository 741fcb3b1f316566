"""The kernels digest a plan section records: what, besides the device, decides which
candidate wins.

sha256 over, in a fixed order: every file under ``kernels/`` (CUDA sources and headers),
the Python modules that define ops and variants (launch configurations, parameter spaces,
the numpy variants), the compile flags (the backend's compile function) and the timing
harness (both backends' timers plus :data:`dnnctl.plan.timing.TIMING_HARNESS_VERSION`).
Version strings miss code changes; hashing the code does not (Triton's lesson).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path

from dnnctl.resources import kernels_dir

_OPS_DIR = Path(__file__).resolve().parent.parent / "ops"
# framework modules under dnnctl/ops that define no kernel behaviour
_NOT_KERNELS = {"__init__.py", "base.py", "check.py", "dispatch.py", "registry.py"}


@functools.cache
def kernels_digest() -> str:
    """'sha256:<hex>' of the kernels, op modules, compile flags and timing harness."""
    h = hashlib.sha256(b"dnnctl-kernels-digest/1\n")
    _add_tree(h, kernels_dir(), "kernels", lambda p: True)
    _add_tree(h, _OPS_DIR, "ops", lambda p: p.suffix == ".py" and not (
        p.parent == _OPS_DIR and p.name in _NOT_KERNELS))
    for label, text in _harness_parts():
        h.update(f"{label}\0{len(text)}\0".encode())
        h.update(text.encode())
    return "sha256:" + h.hexdigest()


def _add_tree(h: hashlib._Hash, root: Path, label: str, keep: object) -> None:
    if not root.is_dir():
        return
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and keep(p))  # type: ignore
    for f in files:
        data = f.read_bytes()
        h.update(f"{label}/{f.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)


def _harness_parts() -> list[tuple[str, str]]:
    from dnnctl.backends import cupy_backend, numpy_backend
    from dnnctl.plan import timing

    parts = [("timing-harness-version", str(timing.TIMING_HARNESS_VERSION))]
    for label, obj in (("compile", cupy_backend._compile), ("arch", cupy_backend.arch_flag),
                       ("cupy-time", cupy_backend.CupyBackend.time),
                       ("numpy-time", numpy_backend.NumpyBackend.time),
                       ("stats", timing.summarize)):
        try:
            parts.append((label, inspect.getsource(obj)))
        except (OSError, TypeError):  # no source shipped: fall back to the qualified name
            parts.append((label, f"{obj.__module__}.{obj.__qualname__}"))
    return parts
