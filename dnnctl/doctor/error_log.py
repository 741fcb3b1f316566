"""The error messages doctor --error / --error-file add to a snapshot's ``errors``.

``--error TEXT`` is taken as it is. ``--error-file LOG`` reads a log or a traceback: every line
is matched against the error catalogue (compat/errors.yaml) and the lines that match are kept
(each distinct line once, at most :data:`MAX_LINES`); a file none of whose lines match gives
its last line that reads like an error, so the report says it was not recognized rather than
nothing. Files follow the input limits of every other file doctor reads (a regular file of at
most 4 MiB); bytes that are not UTF-8 are replaced, as logs often hold some.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from dnnctl.compat.errors import MAX_MESSAGE, match_error, normalize
from dnnctl.compat.inputs import MAX_INPUT_BYTES
from dnnctl.compat.matrix import Matrix
from dnnctl.errors import InputFileError

MAX_LINES = 20  # matched lines kept from one file
ERRORISH = re.compile(r"\b(?:error|fatal|failed|failure|exception|cannot|unable)\b",
                      re.IGNORECASE)


def read_log(path: str | os.PathLike[str]) -> str:
    """A log file's text (a regular file of at most MAX_INPUT_BYTES; bad bytes replaced)."""
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc.strerror or exc}",
                             "give the path of a log or traceback file") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(p, "cannot read: not a regular file",
                             "give the path of a log or traceback file")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputFileError(p, f"cannot read: too large, {st.st_size} bytes (the limit is "
                             f"{MAX_INPUT_BYTES >> 20} MiB)", "pass the part of the log with "
                             "the error (or the error itself with --error)")
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


def log_errors(text: str, matrix: Matrix) -> list[str]:
    """The lines of a log that the catalogue recognizes (each once); else its last line
    that reads like an error; else nothing."""
    kept: list[str] = []
    last = None
    for raw in text.splitlines():
        line = normalize(raw)[:MAX_MESSAGE]
        if not line:
            continue
        if match_error(matrix, line) is not None:
            if line not in kept:
                kept.append(line)
            if len(kept) >= MAX_LINES:
                break
        elif ERRORISH.search(line):
            last = line
    return kept or ([last] if last else [])


def gather(errors: Sequence[str], files: Sequence[str | os.PathLike[str]],
           matrix: Matrix) -> tuple[list[str], list[str]]:
    """(the messages to add, probe notes) for --error TEXT and --error-file LOG."""
    out = [e for e in (str(x).strip() for x in errors) if e]
    notes = []
    for f in files:
        found = log_errors(read_log(f), matrix)
        if not found:
            notes.append(f"--error-file {Path(f).name}: no line reads like an error")
        out += found
    return list(dict.fromkeys(out)), notes
