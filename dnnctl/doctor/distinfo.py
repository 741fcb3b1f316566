"""Installed distributions read straight from their ``*.dist-info`` folders.

``importlib.metadata`` costs ~15 ms to import and parses each METADATA file with the e-mail
package (torch's and jax's are tens of KB): too slow for a doctor that reads a dozen GPU
packages on every start. A wheel's METADATA header block, its ``Requires-Dist`` lines and its
RECORD are simple formats, read here directly; an ``*.egg-info`` folder (rare, older
formats) still goes through importlib.metadata.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_METADATA = 1 << 20  # bytes read of METADATA and other small files
MAX_RECORD = 64 << 20  # torch's RECORD is ~1.5 MB


def _read(path: Path, limit: int = MAX_METADATA) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def headers(text: str) -> dict[str, list[str]]:
    """The RFC 822 header block of a METADATA file: {lower-case name: [values]}."""
    out: dict[str, list[str]] = {}
    last: list[str] | None = None
    for line in text.splitlines():
        if not line:
            break  # the body (the long description) starts after the first empty line
        if line[0] in " \t":  # a continuation (a line of blanks too, as in License texts)
            if last and line.strip():
                last[-1] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        last = out.setdefault(name.strip().lower(), [])
        last.append(value.strip())
    return out


def _legacy(info_dir: Path) -> Any:
    from importlib.metadata import PathDistribution

    return PathDistribution(info_dir)


def read_version(info_dir: Path) -> str | None:
    """The ``Version`` of the distribution in ``info_dir``, or None."""
    if info_dir.suffix == ".egg-info":
        try:
            return _legacy(info_dir).version
        except (OSError, ValueError):
            return None
    text = _read(info_dir / "METADATA")
    values = headers(text).get("version") if text else None
    return values[0] if values and values[0] else None


@dataclass(frozen=True)
class Dist:
    """One installed distribution, read from its ``*.dist-info`` / ``*.egg-info`` folder."""

    name: str  # canonical (PEP 503)
    version: str
    location: Path  # the site directory holding it
    info_dir: Path

    @property
    def _egg(self) -> bool:
        return self.info_dir.suffix == ".egg-info"

    def requires(self) -> list[str]:
        """Its ``Requires-Dist`` entries, markers included."""
        try:
            if self._egg:
                return list(_legacy(self.info_dir).requires or [])
            text = _read(self.info_dir / "METADATA")
            return headers(text).get("requires-dist", []) if text else []
        except (OSError, ValueError):
            return []

    def files(self) -> list[Path]:
        """Absolute paths of the files its RECORD lists (empty when there is no RECORD)."""
        try:
            if self._egg:
                return [Path(str(f.locate())) for f in (_legacy(self.info_dir).files or [])]
            text = _read(self.info_dir / "RECORD", MAX_RECORD)
            if not text:
                return []
            base = self.info_dir.parent
            return [base / row[0] for row in csv.reader(text.splitlines()) if row and row[0]]
        except (OSError, ValueError, csv.Error):
            return []

    def read_text(self, name: str) -> str | None:
        return _read(self.info_dir / name)
