"""Error messages against the catalogue (compat/errors.yaml, table ``error_messages``).

A message is matched as the user saw it: its whitespace collapsed (a traceback pasted on
several lines reads as one), case ignored, at most :data:`MAX_MESSAGE` characters at a time
(a longer text is matched line by line). Rows are tried in file order and the first whose
pattern matches wins, so a specific row comes before a general one; the patterns are the
matrix's checked regular expressions (no nested repeats, no backreferences), whose named
groups capture what a cause's check reads (a compute capability, a library's major).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from dnnctl.compat.matrix import Matrix
from dnnctl.compat.schema import Row

TABLE = "error_messages"
MAX_MESSAGE = 4000  # characters of one message matched at a time
MAX_SHOWN = 200  # characters of a message repeated in a finding


@dataclass(frozen=True)
class ErrorMatch:
    """One message matched to its catalogue row, with the pattern's named groups."""

    row: Row
    text: str  # the message, whitespace collapsed
    groups: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return str(self.row["id"])


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def normalize(text: str) -> str:
    """A message with its whitespace collapsed (lines joined by one space)."""
    return " ".join(str(text).split())


def shown(text: str) -> str:
    """A message shortened for a finding (its head and tail kept)."""
    flat = normalize(text)
    if len(flat) <= MAX_SHOWN:
        return flat
    return flat[:MAX_SHOWN - 60].rstrip() + " … " + flat[-55:].lstrip()


def _search(row: Row, text: str) -> dict[str, str] | None:
    for pattern in row["match"]:
        m = _compiled(pattern).search(text)
        if m:
            return {k: v for k, v in m.groupdict().items() if v is not None}
    return None


def _pieces(text: str) -> list[str]:
    flat = normalize(text)
    if len(flat) <= MAX_MESSAGE:
        return [flat]
    return [line[:MAX_MESSAGE] for line in (normalize(x) for x in str(text).splitlines()) if line]


def match_error(matrix: Matrix, text: str) -> ErrorMatch | None:
    """The first catalogue row that matches ``text``, or None (not recognized)."""
    for piece in _pieces(text):
        for row in matrix.rows(TABLE):
            groups = _search(row, piece)
            if groups is not None:
                return ErrorMatch(row, normalize(text), groups)
    return None


def matching_rows(matrix: Matrix, text: str) -> list[Row]:
    """Every row whose patterns match ``text`` (the first of them is the one that wins)."""
    return [row for row in matrix.rows(TABLE)
            if any(_search(row, piece) is not None for piece in _pieces(text))]
