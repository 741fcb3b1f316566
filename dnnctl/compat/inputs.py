"""Reading user-supplied files safely: matrix overlays, ``--from`` snapshots, patterns.

Every input file must be a regular file of at most :data:`MAX_INPUT_BYTES` (4 MiB) of UTF-8
text whose YAML nests at most :data:`MAX_DEPTH` levels; anything else (a FIFO, a device, a
directory, a huge or binary file, a deeply nested document, a 4,300-digit number) is an
``InputFileError`` naming the file, which the CLI turns into exit status 2. Regular
expressions from overlays are checked for the shapes that make a backtracking matcher run
long (a repeat inside a repeat, backreferences, lookarounds) and are matched against text of
bounded length only.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from dnnctl.errors import InputFileError

try:  # the regex parser the re module itself uses (3.11+: re._parser)
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

MAX_INPUT_BYTES = 4 << 20
MAX_DEPTH = 32
MAX_EVENTS = 1_000_000
MAX_PATTERN = 200  # characters in one overlay regular expression
MAX_SUBJECT = 200  # characters of a name a pattern is matched against


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_input(path: str | os.PathLike[str], *, hint: str | None = None) -> str:
    """The UTF-8 text of a regular file of at most MAX_INPUT_BYTES, or InputFileError."""
    p = str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputFileError(p, "cannot read: no such file", hint) from None
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc.strerror or exc}", hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(p, f"cannot read: {_kind(st.st_mode)}, not a regular file",
                             "give the path of a YAML/JSON file")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputFileError(p, f"cannot read: too large, {st.st_size} bytes (the limit is "
                             f"{MAX_INPUT_BYTES >> 20} MiB)", hint)
    try:  # O_NONBLOCK: if the path was swapped for a FIFO since stat(), do not wait on it
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise InputFileError(p, "cannot read: not a regular file")
            data = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputFileError(p, f"cannot read: {exc.strerror or exc}", hint) from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputFileError(p, f"cannot read: too large (the limit is {MAX_INPUT_BYTES >> 20} MiB)", hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputFileError(p, f"cannot read: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start})", "save the file as UTF-8", line=line) from None


def check_yaml_shape(text: str, path: str | os.PathLike[str], loader: Any = None) -> None:
    """Reject YAML nested deeper than MAX_DEPTH or with more than MAX_EVENTS nodes, before
    anything recursive (the composer, the constructor) sees it."""
    import yaml

    loader = loader or getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = events = 0
    try:
        for ev in yaml.parse(text, Loader=loader):
            events += 1
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise InputFileError(str(path), f"nested more than {MAX_DEPTH} levels deep",
                                         "matrix and snapshot files are a few levels deep",
                                         line=ev.start_mark.line + 1)
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            if events > MAX_EVENTS:
                raise InputFileError(str(path), f"more than {MAX_EVENTS} YAML nodes")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputFileError(str(path), f"not valid YAML: {problem}",
                             "fix the YAML syntax (indentation, quotes, colons)",
                             line=mark.line + 1 if mark is not None else None) from None


# -- regular expressions ---------------------------------------------------------------------

_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}
_BANNED = {"GROUPREF": "a backreference", "GROUPREF_EXISTS": "a conditional group",
           "ASSERT": "a lookahead/lookbehind", "ASSERT_NOT": "a negative lookaround"}


def check_pattern(pattern: object) -> str | None:
    """Why ``pattern`` is not a safe regular expression, or None when it is.

    Safe: at most MAX_PATTERN characters, compiles, no backreferences or lookarounds, and
    no unbounded repeat around something that itself repeats or branches (``(a+)+``,
    ``(a|aa)*``): the shapes that backtrack exponentially."""
    if not isinstance(pattern, str):
        return f"expected a string, got {type(pattern).__name__}"
    if len(pattern) > MAX_PATTERN:
        return f"pattern longer than {MAX_PATTERN} characters"
    try:
        tree = _sre.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"not a regular expression: {exc}"
    return _walk(tree, inside_repeat=False)


def _walk(items: object, inside_repeat: bool) -> str | None:
    for op, arg in items:  # type: ignore[attr-defined]
        name = str(op)
        if name in _BANNED:
            return f"{_BANNED[name]} is not allowed"
        if name in _REPEATS:
            lo, hi, body = arg
            unbounded = hi is _sre.MAXREPEAT or hi > 1
            if unbounded and inside_repeat:
                return "a repeat inside a repeat (e.g. (a+)+) can run for ever"
            why = _walk(body, inside_repeat or unbounded)
            if why:
                return why
        elif name == "BRANCH":
            if inside_repeat and not _prefix_free_literals(arg[1]):
                return "alternatives inside a repeat (e.g. (a|aa)*) can run for ever"
            for alt in arg[1]:
                why = _walk(alt, inside_repeat)
                if why:
                    return why
        elif name == "SUBPATTERN":
            why = _walk(arg[-1], inside_repeat)
            if why:
                return why
        elif name == "ATOMIC_GROUP":
            why = _walk(arg, inside_repeat)
            if why:
                return why
    return None


def _prefix_free_literals(alts: list) -> bool:
    """Alternatives that are plain strings, none a prefix of another (`( Ti| SUPER)*`):
    a matcher never has two ways to match them, so repeating them cannot backtrack."""
    words = []
    for alt in alts:
        if not all(str(op) == "LITERAL" for op, _ in alt):
            return False
        words.append("".join(chr(c) for _, c in alt))
    return all(not b.startswith(a) for a in words for b in words if a is not b)


def bounded(subject: str) -> str:
    """The part of a name a pattern is matched against (names are short; input may not be)."""
    return subject[:MAX_SUBJECT]
