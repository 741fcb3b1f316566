"""A compiled cache of the bundled matrix: validated rows as JSON, so a plain ``doctor``
neither imports PyYAML nor parses and validates ~1,000 lines of YAML on every start.

The key covers each bundled file's path, mtime and size, the schema module and the dnnctl
version; anything that does not match, or cannot be read, is ignored and rebuilt. The cache
lives in ``$DNNCTL_CACHE_DIR`` or ``$XDG_CACHE_HOME/dnnctl`` (``~/.cache/dnnctl``); writing
is best effort and atomic. Overlays are never cached: they are read and checked every time.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from dnnctl.compat.schema import TABLES, Row
from dnnctl.paths import cache_root

FORMAT = 1
MAX_BYTES = 16 << 20


def _key(files: tuple[tuple[str, int, int], ...]) -> str:
    from dnnctl import _version
    from dnnctl.compat import schema

    st = os.stat(schema.__file__)
    parts = [str(FORMAT), _version.__version__, f"{st.st_mtime_ns}:{st.st_size}",
             *(f"{p}:{m}:{s}" for p, m, s in files)]
    text = "\n".join(parts).encode()  # zlib, not hashlib: ~8 ms less start-up
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}{len(text):x}"


def _path(files: tuple[tuple[str, int, int], ...]) -> Path:
    return cache_root() / f"matrix-{_key(files)}.json"


def load(files: tuple[tuple[str, int, int], ...]) -> dict[str, list[Row]] | None:
    """The cached tables for exactly these files, or None."""
    if os.environ.get("DNNCTL_NO_CACHE"):
        return None
    try:
        path = _path(files)
        if path.stat().st_size > MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        tables: dict[str, list[Row]] = {t: [] for t in TABLES}
        for table, rows in data["tables"].items():
            for values, file, line in rows:
                row = Row(values)
                row.file, row.line = file, line
                tables[table].append(row)
        return tables
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(files: tuple[tuple[str, int, int], ...], tables: dict[str, list[Row]]) -> None:
    """Write the cache (best effort: a read-only home only costs the next start)."""
    if os.environ.get("DNNCTL_NO_CACHE"):
        return
    data: dict[str, Any] = {"tables": {t: [[dict(r), r.file, r.line] for r in rows]
                                       for t, rows in tables.items()}}
    try:
        path = _path(files)
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".matrix.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, separators=(",", ":"))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass
