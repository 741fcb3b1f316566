"""Reading and writing plan files (validated on read, atomic under a lock on write).

Plans are written in the fast-reading YAML form (:mod:`dnnctl.files.lineyaml`): the outer
structure in block style, each entry on one line as a JSON object, which any YAML reader
reads and which dnnctl reads with ``json``. Plans written before (all block and flow YAML)
and hand-written ones are read by the YAML loader, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dnnctl.errors import PlanError
from dnnctl.files import gcpause, lineyaml
from dnnctl.files.yamlio import dump_yaml, file_lock, load_yaml, parse_yaml, write_atomic
from dnnctl.plan.schema import Plan
from dnnctl.plan.validate import plan_from_data

HEADER = ("# dnnctl plan: per-shape kernel choices, made by 'dnnctl tune'.\n"
          "# Load with dnnctl.load_plan(path); inspect with 'dnnctl plan show | validate | diff';\n"
          "# keep a choice through re-tuning with 'dnnctl plan pin'.\n")


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Parse and validate a plan file; PlanError names the file, entry and field."""
    data = load_yaml(path, error=PlanError)
    if data is None:
        raise PlanError(str(path), "the file is empty", "regenerate it with 'dnnctl tune'")
    with gcpause.paused():
        return plan_from_data(data, str(path))


def parse_plan(text: str, name: str = "<text>") -> Plan:
    """Like :func:`read_plan`, for YAML text."""
    data = parse_yaml(text, name, error=PlanError)
    if data is None:
        raise PlanError(name, "the text is empty")
    with gcpause.paused():
        return plan_from_data(data, name)


def plan_text(plan: Plan) -> str:
    """The canonical YAML of ``plan`` (stable key and entry order), one line per entry."""
    data = plan.to_data()
    try:
        return lineyaml.dump(data, HEADER)
    except ValueError:  # a value JSON cannot hold (inf): plain YAML, which says '.inf'
        return dump_yaml(data, HEADER)


def write_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write ``plan`` atomically under the plan's file lock."""
    with file_lock(path):
        write_atomic(path, plan_text(plan))
    plan.source = str(path)


def rebuild_plan(path: str | os.PathLike[str], build: Callable[[], Plan]) -> Plan:
    """Write what ``build()`` returns to ``path``, calling it under ``path``'s lock.

    ``build`` reads its inputs (``path`` itself among them, as in ``plan merge A B -o A``)
    while the lock is held, so a concurrent writer of ``path`` is never overwritten unseen.
    """
    with file_lock(path):
        plan = build()
        write_atomic(path, plan_text(plan))
    plan.source = str(path)
    return plan


def update_plan(path: str | os.PathLike[str], change: Callable[[Plan], None]) -> Plan:
    """Read-modify-write ``path`` under its lock (a missing file starts an empty plan).

    ``change`` mutates the plan in place; the result is written atomically and returned.
    """
    p = Path(path)
    with file_lock(p):
        plan = read_plan(p) if p.exists() else Plan(source=str(p))
        change(plan)
        write_atomic(p, plan_text(plan))
    plan.source = str(p)
    return plan
