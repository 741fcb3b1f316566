"""An opt-in wall-clock breakdown of one doctor run (``doctor --timings`` or
``DNNCTL_PROFILE=1``).

Probes wrap their work in :func:`span`; when timing is off a span costs one flag test. The
spans are wall milliseconds keyed by name, in the order they ended. Probes run in parallel
threads, so they overlap: their sum is more than the run took. ``start-up`` is the time from
the process's exec to the doctor command starting (interpreter and imports), read from
``/proc`` (10 ms resolution; absent where there is no ``/proc``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "DNNCTL_PROFILE"

_lock = threading.Lock()
_spans: dict[str, float] = {}
_state = {"on": os.environ.get(ENV, "").strip() not in ("", "0")}


def enabled() -> bool:
    return _state["on"]


def enable(on: bool = True) -> None:
    """Turn recording on (``--timings``) or off; recorded spans are kept."""
    _state["on"] = on


def reset() -> None:
    with _lock:
        _spans.clear()


def record(name: str, ms: float) -> None:
    """Record ``name`` as ``ms`` wall milliseconds (a name seen again accumulates)."""
    if _state["on"]:
        with _lock:
            _spans[name] = round(_spans.pop(name, 0.0) + ms, 1)


@contextmanager
def span(name: str) -> Iterator[None]:
    """Time the block as ``name`` when timing is on."""
    if not _state["on"]:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        record(name, (time.perf_counter() - started) * 1000.0)


def spans() -> dict[str, float]:
    """A copy of the spans recorded so far, in the order they ended."""
    with _lock:
        return dict(_spans)


def process_ms() -> float | None:
    """Milliseconds since this process was exec'd (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        return round(max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK")) * 1000.0, 1)
    except (OSError, ValueError, IndexError):
        return None


def bytecode_note() -> str | None:
    """A warning when dnnctl's modules were compiled from source in this run (no .pyc)."""
    import importlib.util
    import sys

    api = sys.modules.get("dnnctl.api")
    source = getattr(api, "__file__", None)
    try:
        cached = bool(source) and os.path.exists(importlib.util.cache_from_source(source))
    except (NotImplementedError, ValueError):
        cached = True
    if cached:
        return None
    why = " (PYTHONDONTWRITEBYTECODE is set)" if sys.dont_write_bytecode else ""
    return (f"note: no .pyc for dnnctl{why}:\n  every start compiles its modules (~70 ms "
            "CPU on a CPU box);\n  `python -m compileall -q dnnctl` once, as pip install does")


def table(data: dict[str, float]) -> list[str]:
    """Human lines for stderr, 80 columns at most."""
    lines = ["timings (wall ms; the probes run in parallel, so they overlap):"]
    for name, ms in data.items():
        lines.append(f"  {name[:64]:<64} {ms:>9.1f}")
    return lines
