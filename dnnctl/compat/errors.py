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


# where a message prints a CUDA error as a bare number: a wrapper's words, then the number
# (ollama's "cudart init failure: 802", "cuda driver library init failure: 3", ggml's "CUDA
# error 222 at", "cudaSetDevice err: 802", "cuInit(0) failed: 999", "CUresult 100")
_NUMBERED = re.compile(
    r"(?:\bcu(?:da)?rt init failure|\bcuda driver library init failure|\bCUDA error"
    r"|\bcu(?:da)?[A-Z]\w*(?:\(\w*\))? (?:err(?:or)?|failed|returned)|\bCUresult"
    r"|\bcudaError_t)[\s:=(]*(?:with |code |error )*(\d{1,3})\b(?!\.\d)")


def annotate(matrix: Matrix, text: str) -> str:
    """``text`` with the names of each CUDA error it prints only as a number added after it
    (table ``cuda_error_codes``): "cudart init failure: 802 (cudaErrorSystemNotReady /
    CUDA_ERROR_SYSTEM_NOT_READY)". A number not in the table is left as it is."""
    codes = {int(r["code"]): r for r in matrix.rows("cuda_error_codes") if not r.uncertain}

    def named(m: re.Match[str]) -> str:
        row = codes.get(int(m.group(1)))
        if row is None:
            return m.group(0)
        names = " / ".join(n for n in (row["runtime"], row.get("driver")) if n)
        return f"{m.group(0)} ({names})"

    return _NUMBERED.sub(named, text)


def _pieces(text: str) -> list[str]:
    flat = normalize(text)
    if len(flat) <= MAX_MESSAGE:
        return [flat]
    return [line[:MAX_MESSAGE] for line in (normalize(x) for x in str(text).splitlines()) if line]


def match_error(matrix: Matrix, text: str) -> ErrorMatch | None:
    """The first catalogue row that matches ``text`` (its bare CUDA error numbers named:
    :func:`annotate`), or None (not recognized)."""
    for piece in _pieces(annotate(matrix, text)):
        for row in matrix.rows(TABLE):
            groups = _search(row, piece)
            if groups is not None:
                return ErrorMatch(row, normalize(text), groups)
    return None


def matching_rows(matrix: Matrix, text: str) -> list[Row]:
    """Every row whose patterns match ``text`` (the first of them is the one that wins)."""
    text = annotate(matrix, text)
    return [row for row in matrix.rows(TABLE)
            if any(_search(row, piece) is not None for piece in _pieces(text))]
