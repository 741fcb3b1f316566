"""YAML reading and writing for plans and workloads.

Reading uses PyYAML's safe loader (no Python objects can ever be built) made stricter still:
explicit tags (``!!python/...``, ``!foo``, even ``!!str``), aliases (``*ref``, the
"billion laughs" vector) and duplicate mapping keys are refused with the line they are on.
Writing is atomic (temp file in the same directory, fsync, rename) under a file lock, with a
fixed key order and small mappings in flow style so a file diffs line by line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

from dnnctl.errors import InputFileError
from dnnctl.plan.locking import path_lock
from dnnctl.plan.schema import _Flow

MAX_FILE_BYTES = 256 << 20  # a plan with a million entries is well under this


class StrictYamlError(yaml.YAMLError):
    """A construct that PyYAML's safe loader accepts but a dnnctl file never needs."""

    def __init__(self, message: str, mark: Any = None):
        super().__init__(message)
        self.message = message
        self.problem_mark = mark


class _StrictLoader(yaml.SafeLoader):
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
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | os.PathLike[str], error: Callable[..., InputFileError] = InputFileError
              ) -> Any:
    """Parse a YAML (or JSON) file strictly; errors name the file and line."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise error(str(p), f"file is {size} bytes, more than the {MAX_FILE_BYTES} allowed",
                        "is this really a dnnctl file?")
        text = p.read_bytes()
    except OSError as exc:
        raise error(str(p), f"cannot be read: {exc.strerror or exc}",
                    "check the path and permissions") from None
    return parse_yaml(text, str(p), error)


def parse_yaml(text: str | bytes, name: str,
               error: Callable[..., InputFileError] = InputFileError) -> Any:
    """Parse YAML text strictly (see module doc)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
                        "is this really a dnnctl file?") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        msg = getattr(exc, "message", None) or getattr(exc, "problem", None) or str(exc)
        raise error(name, f"not valid for dnnctl YAML: {msg}", "fix or regenerate the file",
                    line=line) from None
    except RecursionError:
        raise error(name, "nesting is too deep", "is this really a dnnctl file?") from None


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _repr_flow(dumper: yaml.SafeDumper, data: _Flow) -> Any:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _repr_list(dumper: yaml.SafeDumper, data: list) -> Any:
    # lists of scalars (shapes, strides) stay on one line; lists of mappings go block style
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _repr_dict(dumper: yaml.SafeDumper, data: dict) -> Any:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


_Dumper.add_representer(_Flow, _repr_flow)
_Dumper.add_representer(list, _repr_list)
_Dumper.add_representer(dict, _repr_dict)


def dump_yaml(data: Any, header: str = "") -> str:
    """YAML text with the caller's key order, flow style where marked, no aliases or tags."""
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True,
                     default_flow_style=False)
    return header + body


def file_lock(path: str | os.PathLike[str], timeout: float = 60.0) -> AbstractContextManager:
    """The lock every reader-modify-writer of ``path`` holds (see :mod:`dnnctl.plan.locking`:
    it names its holder, and it leaves no lock files behind)."""
    return path_lock(path, timeout)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file in the same directory, fsync, rename.

    The caller holds :func:`file_lock` when the write depends on what it read before.
    """
    p = Path(path)
    directory = p.parent if str(p.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=directory)
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
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename durable too
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
