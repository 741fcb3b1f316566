"""A cache of parsed large YAML files, by content, so a big plan is parsed once.

YAML parsing costs about a second per megabyte even with libyaml (PyYAML builds a Python
node per scalar); a 20,000-entry plan is ~12 MB. Plans dnnctl writes now are in the form
:mod:`dnnctl.files.lineyaml` reads with ``json`` and skip this cache; it serves large files
in plain YAML (plans written before, hand-written ones). A file above ``MIN_BYTES`` that
parsed strictly is stored as JSON under ``<cache root>/parsed/<sha256>.json`` (the root:
:func:`dnnctl.paths.cache_root`; only when JSON gives back exactly the same data), and later
reads of the same bytes load that JSON (~0.2 s) instead. The cache holds plain data only;
callers validate it exactly as if it had just been parsed, so a tampered cache entry can at
worst make the load fail. The newest ``KEEP`` entries are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dnnctl.paths import cache_root

MIN_BYTES = 1 << 20
KEEP = 8
_MISSING = object()


def cache_dir() -> Path:
    return cache_root() / "parsed"


def key_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def get(key: str) -> Any:
    """The cached data for ``key``, or ``_MISSING``."""
    path = cache_dir() / f"{key}.json"
    try:
        text = path.read_text(encoding="utf-8")
        value = json.loads(text)
    except (OSError, ValueError):
        return _MISSING
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: kept longer
    return value


def put(key: str, value: Any) -> None:
    """Store ``value`` if JSON round-trips it exactly; never fails the caller."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        if json.loads(text) != value:  # e.g. dates, integer keys, tuples: not cached
            return
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".parsed.", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, d / f"{key}.json")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        entries = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            with contextlib.suppress(OSError):
                old.unlink()
    except (OSError, TypeError, ValueError, RecursionError):
        return


def missing(value: Any) -> bool:
    return value is _MISSING
