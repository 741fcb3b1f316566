"""Workloads: the problems one model step runs, with how often each occurs.

File form (``schema: dnnctl-workload/1``)::

    schema: dnnctl-workload/1
    name: resnet50
    problems:
      - {op: conv2d, key: {n: 32, c: 64, ...}, count: 3}
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dnnctl.errors import InputFileError, UsageError
from dnnctl.files.yamlio import Flow, dump_yaml, file_lock, load_yaml, write_atomic
from dnnctl.ops import registry
from dnnctl.ops.base import Problem, problem_sort_key

SCHEMA = "dnnctl-workload/1"
MAX_PROBLEMS = 1_000_000


@dataclass(frozen=True)
class WorkItem:
    problem: Problem
    count: int = 1


@dataclass
class Workload:
    """An ordered set of distinct problems with per-step counts."""

    name: str
    items: list[WorkItem] = field(default_factory=list)
    _index: dict[Problem, int] = field(default_factory=dict, repr=False, compare=False)

    def add(self, op: str | Problem, key: Mapping[str, Any] | None = None, count: int = 1
            ) -> Problem:
        """Add a problem (an op name + raw key, or a Problem); repeats add to the count."""
        problem = op if isinstance(op, Problem) else registry.get_op(op).problem(key or {})
        if len(self._index) != len(self.items):
            self._index = {it.problem: i for i, it in enumerate(self.items)}
        i = self._index.get(problem)
        if i is not None:
            self.items[i] = WorkItem(problem, self.items[i].count + count)
        else:
            self._index[problem] = len(self.items)
            self.items.append(WorkItem(problem, count))
        return problem

    @property
    def problems(self) -> list[Problem]:
        return [it.problem for it in self.items]

    def ops(self) -> list[str]:
        return sorted({it.problem.op for it in self.items})

    def only_ops(self, ops: Iterable[str] | None) -> Workload:
        """The sub-workload of the given ops (all when ``ops`` is None or empty)."""
        wanted = set(ops or ())
        if not wanted:
            return self
        for name in wanted:
            registry.get_op(name)  # unknown op -> UsageError with the known ones
        return Workload(self.name, [it for it in self.items if it.problem.op in wanted])

    def total_calls(self) -> int:
        return sum(it.count for it in self.items)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this workload as a ``dnnctl-workload/1`` file (atomically, under a lock)."""
        write_workload(self, path)

    def to_data(self, *, sort: bool = False) -> dict[str, Any]:
        items = sorted(self.items, key=lambda it: problem_sort_key(it.problem)) if sort \
            else self.items
        return {"schema": SCHEMA, "name": self.name, "problems": [
            Flow({"op": it.problem.op, "key": Flow(it.problem.as_dict()), "count": it.count})
            for it in items]}


def workload_from_data(data: Any, path: str) -> Workload:
    """Validate parsed YAML of a workload file; errors name the file, problem and field."""
    def fail(message: str, where: str | None = None, hint: str | None = None) -> InputFileError:
        return InputFileError(path, message, hint or "fix the file, or write one with "
                              "dnnctl.workloads.write_workload", where=where)

    if not isinstance(data, Mapping):
        raise fail("expected a mapping with 'schema', 'name' and 'problems'")
    for k in data:
        if k not in ("schema", "name", "problems"):
            raise fail(f"unknown field {k!r}", where=f"field '{k}'")
    if data.get("schema") != SCHEMA:
        raise fail(f"unsupported schema {data.get('schema')!r}; this dnnctl reads {SCHEMA!r}",
                   where="field 'schema'")
    name = data.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str) or len(name) > 200:
        raise fail("the name must be text of at most 200 characters", where="field 'name'")
    raw = data.get("problems")
    if not isinstance(raw, list):
        raise fail("expected a list of {op, key, count}", where="field 'problems'")
    if len(raw) > MAX_PROBLEMS:
        raise fail(f"{len(raw)} problems is more than the {MAX_PROBLEMS} allowed")
    wl = Workload(name)
    for i, item in enumerate(raw):
        where = f"problem {i}"
        if not isinstance(item, Mapping):
            raise fail("expected a mapping {op, key, count}", where=where)
        for k in item:
            if k not in ("op", "key", "count"):
                raise fail(f"unknown field {k!r}", where=f"{where}, field '{k}'")
        op_name, key, count = item.get("op"), item.get("key"), item.get("count", 1)
        if not isinstance(op_name, str):
            raise fail("expected an op name", where=f"{where}, field 'op'")
        if not isinstance(key, Mapping):
            raise fail("expected a mapping of key fields", where=f"{where}, field 'key'")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10**9:
            raise fail(f"count must be an integer in [1, 1e9], got {count!r}",
                       where=f"{where}, field 'count'")
        try:
            wl.add(op_name, dict(key), count)
        except UsageError as exc:
            field_ = "op" if "unknown op" in exc.message else "key"
            raise fail(exc.message, where=f"{where}, field '{field_}'", hint=exc.hint) from None
    return wl


def read_workload(path: str | os.PathLike[str]) -> Workload:
    """Read and validate a ``dnnctl-workload/1`` file."""
    data = load_yaml(path)
    if data is None:
        raise InputFileError(str(path), "the file is empty")
    return workload_from_data(data, str(path))


def write_workload(workload: Workload, path: str | os.PathLike[str]) -> None:
    """Write a workload file atomically under its lock."""
    text = dump_yaml(workload.to_data(),
                     "# dnnctl workload: tune it with 'dnnctl tune <this file>'.\n")
    with file_lock(path):
        write_atomic(path, text)
