"""YAML reading and writing for plans and workloads.

Reading uses PyYAML's safe loader (no Python objects can ever be built) made stricter still:
explicit tags (``!!python/...``, ``!foo``, even ``!!str``), aliases (``*ref``, the
"billion laughs" vector) and duplicate mapping keys are refused with the line they are on.
Writing is atomic (temp file in the same directory, fsync, rename) under a file lock, with a
fixed key order and small mappings in flow style so a file diffs line by line.

Text in the form :mod:`dnnctl.files.lineyaml` writes (small mappings as single-line JSON,
which plans use) is read through that module: the same values and the same errors, much
faster (a 20,000-entry plan: about 0.4 s instead of 6 s with libyaml).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

from dnnctl.errors import InputFileError
from dnnctl.files import gcpause, lineyaml, parsecache
from dnnctl.files.locking import path_lock


class Flow(dict):  # type: ignore[type-arg]
    """A mapping written in YAML flow style ({a: 1, b: 2}) to keep an entry compact."""


MAX_FILE_BYTES = 256 << 20  # a plan with a million entries is well under this


class StrictYamlError(yaml.YAMLError):
    """A construct that PyYAML's safe loader accepts but a dnnctl file never needs."""

    def __init__(self, message: str, mark: Any = None):
        super().__init__(message)
        self.message = message
        self.problem_mark = mark


class _StrictChecks:
    """The strict rules, shared by the pure-Python and the libyaml-based loader."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise StrictYamlError("mapping keys must be plain scalars", key_node.start_mark)
            if key_node.value == "<<":
                raise StrictYamlError("YAML merge keys (<<) are not allowed", key_node.start_mark)
            if key_node.value in seen:
                raise StrictYamlError(f"duplicate key {key_node.value!r}", key_node.start_mark)
            seen.add(key_node.value)
        out = super().construct_mapping(node, deep=deep)  # type: ignore[misc]
        if len(out) != len(node.value):  # e.g. '1' and '0x1' spell one integer key
            raise StrictYamlError("duplicate key (two spellings of one value)",
                                  node.start_mark)
        return out


class _StrictLoader(_StrictChecks, yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise StrictYamlError(f"YAML alias *{event.anchor} is not allowed", event.start_mark)
        tag = getattr(event, "tag", None)
        if tag is not None and isinstance(
                event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            raise StrictYamlError(f"YAML tag {tag!r} is not allowed (plain values only)",
                                  event.start_mark)
        return super().compose_node(parent, index)


_PLAIN = {yaml.SequenceNode: "tag:yaml.org,2002:seq", yaml.MappingNode: "tag:yaml.org,2002:map"}


if hasattr(yaml, "CSafeLoader"):
    class _FastStrictLoader(_StrictChecks, yaml.CSafeLoader):  # type: ignore[name-defined]
        """libyaml parses and composes (about ten times faster); the same rules hold.

        libyaml hands over composed nodes, so the rules are checked on nodes: a node seen
        twice is an alias; a node whose tag is not the one its plain text resolves to
        carries an explicit tag (an explicit tag that resolves the same, like ``!!str`` on
        plain text, changes nothing and is let through). Resolving and constructing the
        many repeated scalars of a plan (field names, variants, small numbers) is memoized.
        """

        def __init__(self, stream: Any):
            super().__init__(stream)
            self._resolved: dict[tuple[str, Any], str] = {}
            self._scalars: dict[tuple[str, str, Any], Any] = {}

        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            if kind is not yaml.ScalarNode:
                return super().resolve(kind, value, implicit)
            ck = (value, implicit)
            tag = self._resolved.get(ck)
            if tag is None:
                tag = self._resolved[ck] = super().resolve(kind, value, implicit)
            return tag

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            if node in self.constructed_objects or node in self.recursive_objects:
                raise StrictYamlError("YAML aliases (*ref) are not allowed", node.start_mark)
            if isinstance(node, yaml.ScalarNode):
                bare = not node.style  # libyaml: '' for plain text, else the quote
                plain = self.resolve(yaml.ScalarNode, node.value, (bare, not bare))
                if node.tag != plain:
                    raise StrictYamlError(f"YAML tag {node.tag!r} is not allowed (plain "
                                          "values only)", node.start_mark)
                ck = (node.tag, node.value, node.style)
                if ck in self._scalars:
                    value = self._scalars[ck]
                    self.constructed_objects[node] = value
                    return value
                value = super().construct_object(node, deep)
                self._scalars[ck] = value
                return value
            if node.tag != _PLAIN.get(type(node)):
                raise StrictYamlError(f"YAML tag {node.tag!r} is not allowed (plain values "
                                      "only)", node.start_mark)
            return super().construct_object(node, deep)

    _LOADER: type = _FastStrictLoader
else:  # PyYAML built without libyaml
    _LOADER = _StrictLoader


def load_yaml(path: str | os.PathLike[str], error: Callable[..., InputFileError] = InputFileError
              ) -> Any:
    """Parse a YAML (or JSON) file strictly; errors name the file and line. A file in the
    fast-reading form (:mod:`dnnctl.files.lineyaml`) is read as such; other files over a
    megabyte are parsed once per content (:mod:`dnnctl.files.parsecache`)."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block the read forever
            raise error(str(p), "is a directory" if stat.S_ISDIR(st.st_mode)
                        else "is not a regular file", "give the path of a YAML file")
        size = st.st_size
        if size > MAX_FILE_BYTES:
            raise error(str(p), f"file is {size} bytes, more than the {MAX_FILE_BYTES} allowed",
                        "is this really a dnnctl file?")
        raw = p.read_bytes()
    except OSError as exc:
        raise error(str(p), f"cannot be read: {exc.strerror or exc}",
                    "check the path and permissions") from None
    text = _decode(raw, str(p), error)
    with gcpause.paused():
        data = lineyaml.parse(text, lambda t, at: _parse_strict(t, str(p), error, at))
        if data is not lineyaml.NOT_THIS_FORM:
            return data
        if len(raw) < parsecache.MIN_BYTES:
            return _parse_strict(text, str(p), error)
        key = parsecache.key_of(raw)
        cached = parsecache.get(key)
        if not parsecache.missing(cached):
            return cached
        data = _parse_strict(text, str(p), error)
    parsecache.put(key, data)
    return data


def parse_yaml(text: str | bytes, name: str,
               error: Callable[..., InputFileError] = InputFileError) -> Any:
    """Parse YAML text strictly (see module doc)."""
    if isinstance(text, bytes):
        text = _decode(text, name, error)
    bang: list[bool] = []  # whether the file has a '!' (asked only if a line falls back)

    def one_line(t: str, at: int) -> Any:
        # a line read alone takes the loader the whole file would (libyaml and the exact
        # loader differ on some malformed flow text, e.g. a '?' inside a mapping)
        if not bang:
            bang.append("!" in text)
        return _parse_strict(t, name, error, at, exact=bang[0])

    with gcpause.paused():
        data = lineyaml.parse(text, one_line)
        if data is not lineyaml.NOT_THIS_FORM:
            return data
        return _parse_strict(text, name, error)


def _decode(raw: bytes, name: str, error: Callable[..., InputFileError]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    "is this really a dnnctl file?") from None


def _parse_strict(text: str, name: str, error: Callable[..., InputFileError],
                  line: int | None = None, exact: bool = False) -> Any:
    """The strict YAML loader on ``text`` (no fast form); errors name the line. ``line``:
    ``text`` is that line (0-based) of the file, read alone; ``exact``: the exact loader
    whatever ``text`` holds (the file it comes from has a '!')."""
    try:
        # libyaml cannot tell an explicit tag that changes nothing (``!!str`` on text) from
        # none, and such files are refused too: any '!' takes the exact, slower loader
        loader = _StrictLoader if exact or "!" in text else _LOADER
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoader subclasses
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = None
        if mark is not None:
            # libyaml puts the end of a text without a final newline on the line after it
            at = min(mark.line + 1, text.count("\n") + 1) + (line or 0)
        msg = getattr(exc, "message", None) or getattr(exc, "problem", None) or str(exc)
        raise error(name, f"not valid for dnnctl YAML: {msg}", "fix or regenerate the file",
                    line=at, where=None if line is None else "that line read alone"
                    ) from None
    except RecursionError:
        raise error(name, "nesting is too deep", "is this really a dnnctl file?") from None


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _repr_flow(dumper: yaml.SafeDumper, data: Flow) -> Any:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _repr_list(dumper: yaml.SafeDumper, data: list) -> Any:
    # lists of scalars (shapes, strides) stay on one line; lists of mappings go block style
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _repr_dict(dumper: yaml.SafeDumper, data: dict) -> Any:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


class _FastDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """libyaml's emitter where PyYAML has it (same text, several times faster)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


for _cls in (_Dumper, _FastDumper):
    _cls.add_representer(Flow, _repr_flow)
    _cls.add_representer(list, _repr_list)
    _cls.add_representer(dict, _repr_dict)


def dump_yaml(data: Any, header: str = "") -> str:
    """YAML text with the caller's key order, flow style where marked, no aliases or tags."""
    body = yaml.dump(data, Dumper=_FastDumper, sort_keys=False, width=4096, allow_unicode=True,
                     default_flow_style=False)
    return header + body


def file_lock(path: str | os.PathLike[str], timeout: float = 60.0) -> AbstractContextManager:
    """The lock every reader-modify-writer of ``path`` holds (see :mod:`dnnctl.files.locking`:
    it names its holder, and it leaves no lock files behind)."""
    return path_lock(path, timeout)


_SCHEMA_LINE = re.compile(r"""^schema:\s*["']?(dnnctl-[a-z]+)/""", re.MULTILINE)


def check_replaceable(path: str | os.PathLike[str], kind: str,
                      inputs: tuple[str | os.PathLike[str], ...] = ()) -> None:
    """Refuse an output path whose file this command must not replace: a directory, one of
    the command's ``inputs``, or an existing file that is not of ``kind`` (a schema such as
    ``dnnctl-plan``, or ``html``). An empty file, or none, may be written."""
    p = Path(path)
    if p.is_dir():
        raise InputFileError(str(p), "is a directory", "give a file name for the output")
    if not p.exists():
        return
    for other in inputs:
        try:
            same = os.path.samefile(p, other)
        except OSError:
            same = False
        if same:
            raise InputFileError(str(p), "is also this command's input: writing the output "
                                 "there would destroy it", "choose another output path")
    if not p.is_file():
        raise InputFileError(str(p), "is not a regular file", "choose another output path")
    try:
        with open(p, "rb") as fh:
            head = fh.read(65536).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputFileError(str(p), f"cannot be read: {exc.strerror or exc}",
                             "check its permissions, or choose another output path") from None
    if not head.strip():
        return
    if kind == "html":
        ok = head.lstrip().lower().startswith(("<!doctype html", "<html"))
    else:
        found = _SCHEMA_LINE.search(head)
        ok = found is not None and found.group(1) == kind
    if not ok:
        raise InputFileError(str(p), f"exists and is not a {kind} file: it would be replaced",
                             "choose another output path, or remove the file first")


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file in the same directory, fsync, rename.

    The caller holds :func:`file_lock` when the write depends on what it read before.
    """
    p = Path(path)
    if p.is_dir():
        raise InputFileError(str(p), "is a directory", "give a file name for the output")
    directory = p.parent if str(p.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputFileError(str(p), f"cannot be written: {exc.strerror or exc}",
                             "check the directory and its permissions") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if p.exists():
            os.chmod(tmp, p.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InputFileError(str(p), f"cannot be written: {exc.strerror or exc}",
                                 "check the path and its permissions") from None
        raise
    try:  # make the rename durable too
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
