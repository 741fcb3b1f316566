"""From parsed YAML to a :class:`Plan`, trusting nothing.

Every field is type- and range-checked; ops, variants and parameters must exist in this
dnnctl's registry (parameters via ``Variant.check_params`` plus an exact type check, so
``true`` is not taken for ``1``). Errors are :class:`PlanError` naming the file, the entry
(section and entry index, op and key) and the field.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Mapping
from typing import Any

from dnnctl.errors import PlanError, UsageError
from dnnctl.ops import registry
from dnnctl.ops.base import Choice, Problem
from dnnctl.plan.schema import (
    DEVICE_FIELDS,
    ENTRY_FIELDS,
    FAIL_REASONS,
    SCHEMA,
    SECTION_FIELDS,
    Alternative,
    Plan,
    PlanEntry,
    Section,
    Timing,
)

MAX_US = 1e10  # ~3 hours per call: anything larger is not a timing
MAX_COUNT = 10**9
MAX_WORKSPACE = 1 << 50
MAX_TEXT = 256
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
BACKENDS = ("cupy", "numpy")


class _Where:
    """Where in the file we are, for error messages. ``problem``'s label is added when an
    error is made (most entries have none, and the label costs more than the check)."""

    def __init__(self, path: str, parts: tuple[str, ...] = (), problem: Problem | None = None):
        self.path = path
        self.parts = parts
        self.problem = problem

    def __truediv__(self, part: str) -> _Where:
        return _Where(self.path, (*self.parts, part))

    def of(self, problem: Problem) -> _Where:
        return _Where(self.path, self.parts, problem)

    def fail(self, field: str, message: str, hint: str | None = None) -> PlanError:
        parts = self.parts if self.problem is None else (
            *self.parts, f"({self.problem.short()})")
        loc = " ".join(parts)
        where = f"{loc}, field '{field}'" if loc else f"field '{field}'"
        return PlanError(self.path, message, hint or "fix the entry, or regenerate the plan "
                         "with 'dnnctl tune'", where=where)


def plan_from_data(data: Any, path: str) -> Plan:
    """Validate parsed YAML of a whole plan file."""
    top = _Where(path)
    if not isinstance(data, Mapping):
        raise top.fail("schema", f"expected a mapping with 'schema' and 'sections', got "
                       f"{_type(data)}", "is this a dnnctl plan? ('dnnctl tune' writes one)")
    _no_unknown(data, ("schema", "sections"), top)
    if data.get("schema") != SCHEMA:
        raise top.fail("schema", f"unsupported schema {data.get('schema')!r}; this dnnctl "
                       f"reads {SCHEMA!r}", "regenerate the plan with this dnnctl version")
    sections = data.get("sections")
    if not isinstance(sections, list):
        raise top.fail("sections", f"expected a list, got {_type(sections)}")
    out = [section_from_data(s, top / f"sections[{i}]") for i, s in enumerate(sections)]
    return Plan(out, source=path)


def section_from_data(data: Any, where: _Where) -> Section:
    _record(data, "a section", SECTION_FIELDS, ("device", "kernels_digest", "entries"), where)
    dev = data["device"]
    if not isinstance(dev, Mapping):
        raise where.fail("device", f"expected a mapping, got {_type(dev)}")
    _no_unknown(dev, DEVICE_FIELDS, where, prefix="device.")
    device: dict[str, Any] = {}
    for f in DEVICE_FIELDS:
        v = dev.get(f)
        if f == "sm_count":
            device[f] = _int(v if v is not None else 0, where, "device.sm_count", 0, 10**6)
        else:
            device[f] = _text(v if v is not None else "", where, f"device.{f}")
    if device["backend"] not in BACKENDS:
        raise where.fail("device.backend", f"unknown backend {device['backend']!r}",
                         f"use one of {', '.join(BACKENDS)}")
    digest = data["kernels_digest"]
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise where.fail("kernels_digest", f"expected 'sha256:' and 64 hex digits, got "
                         f"{_short(digest)}")
    created = data.get("created", "")
    if isinstance(created, (_dt.datetime, _dt.date)):
        created = created.isoformat()
    created = _text(created, where, "created")
    tuning = data.get("tuning") or {}
    if not isinstance(tuning, Mapping) or len(tuning) > 64:
        raise where.fail("tuning", "expected a mapping of at most 64 settings")
    tun: dict[str, Any] = {}
    for k, v in tuning.items():
        name = _text(k, where, "tuning")
        if isinstance(v, bool) or v is None or isinstance(v, str):
            tun[name] = _text(v, where, f"tuning.{name}") if isinstance(v, str) else v
        elif isinstance(v, (int, float)):
            tun[name] = _num(v, where, f"tuning.{name}", -1e12, 1e12)
        else:
            raise where.fail(f"tuning.{name}", f"expected a plain value, got {_type(v)}")
    entries_raw = data["entries"]
    if not isinstance(entries_raw, list):
        raise where.fail("entries", f"expected a list, got {_type(entries_raw)}")
    backend = device["backend"]
    entries: list[PlanEntry] = []
    seen: dict[Problem, int] = {}
    choices: _Choices = {}
    for i, raw in enumerate(entries_raw):
        entry = entry_from_data(raw, where / f"entry {i}", backend, choices)
        if entry.problem in seen:
            raise (where / f"entry {i} ({entry.problem.short()})").fail(
                "key", f"duplicate of entry {seen[entry.problem]}",
                "keep one entry per key ('dnnctl plan merge' resolves conflicts)")
        seen[entry.problem] = i
        entries.append(entry)
    return Section(device, digest, created, tun, entries)


def entry_from_data(data: Any, where: _Where, backend: str,
                    choices: _Choices | None = None) -> PlanEntry:
    """Validate one entry; ``choices`` memoizes the choices already accepted (a section
    names a few hundred distinct ones, each checked once)."""
    if choices is None:
        choices = {}
    _record(data, "an entry", ENTRY_FIELDS, ("op", "key", "choice"), where)
    op_name = data["op"]
    if not isinstance(op_name, str):
        raise where.fail("op", f"expected an op name, got {_type(op_name)}")
    try:
        op = registry.get_op(op_name)
    except UsageError as exc:
        raise where.fail("op", exc.message, exc.hint) from None
    key = data["key"]
    if not _is_map(key):
        raise where.fail("key", f"expected a mapping, got {_type(key)}")
    try:
        problem = op.problem(key)  # it copies the mapping; never changes it
    except UsageError as exc:
        raise where.fail("key", exc.message, exc.hint) from None
    where = where.of(problem)
    choice = _choice(data["choice"], where, "choice", problem, backend, choices)
    stats = None
    if data.get("stats") is not None:
        stats = _timing(data["stats"], where)
    runner_up = _alternative(data.get("runner_up"), where, "runner_up", problem, backend,
                             choices)
    default = _alternative(data.get("default"), where, "default", problem, backend, choices)
    failed_raw = data.get("failed") or {}
    if not _is_map(failed_raw):
        raise where.fail("failed", f"expected a mapping, got {_type(failed_raw)}")
    _no_unknown(failed_raw, FAIL_REASONS, where, prefix="failed.")
    failed = {r: _int(failed_raw.get(r, 0), where, name, 0, MAX_COUNT)
              for r, name in _FAILED_FIELDS}
    max_err = data.get("max_rel_err")
    partial = _bool(data.get("partial", False), where, "partial")
    compared = data.get("compared")
    if compared is not None:
        compared = _int(compared, where, "compared", 0, MAX_COUNT)
    elif partial:
        raise where.fail("compared", "is missing (a partial entry says how many candidates "
                         "were compared)")
    return PlanEntry(
        problem=problem, choice=choice, stats=stats, runner_up=runner_up, default=default,
        tried=_int(data.get("tried", 0), where, "tried", 0, MAX_COUNT), failed=failed,
        workspace_bytes=_int(data.get("workspace_bytes", 0), where, "workspace_bytes", 0,
                             MAX_WORKSPACE),
        max_rel_err=None if max_err is None else _num(max_err, where, "max_rel_err", 0.0, 1e6),
        pinned=_bool(data.get("pinned", False), where, "pinned"),
        partial=partial, compared=compared, tie=_tie(data.get("tie"), where),
    )


_FAILED_FIELDS = tuple((r, f"failed.{r}") for r in FAIL_REASONS)


def _tie(data: Any, where: _Where) -> tuple[str, ...]:
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > 64:
        raise where.fail("tie", "expected a list of at most 64 candidate labels")
    return tuple(_text(x, where, "tie") for x in data)


def entry_from_record(data: Any, backend: str, source: str) -> PlanEntry:
    """Validate one entry given as plain data (e.g. from a tuning journal)."""
    return entry_from_data(data, _Where(source), backend)


def check_choice(problem: Problem, backend: str, variant: Any, params: Any) -> Choice:
    """Validate a variant name + params for ``problem`` (UsageError naming what is wrong)."""
    w = _Where("")
    try:
        return _choice({"variant": variant, "params": params}, w, "choice", problem, backend)
    except PlanError as exc:
        raise UsageError(exc.message.split(": ", 1)[-1], exc.hint) from None


# accepted choices by (op, variant, parameters with their types): the checks below depend
# on nothing else (the backend is the section's), so a repeat is a dict lookup
_Choices = dict[tuple[Any, ...], Choice]
_MEMO_TYPES = frozenset((int, str, bool))  # values whose equal ones are the same value


def _choice(data: Any, where: _Where, field: str, problem: Problem, backend: str,
            choices: _Choices | None = None) -> Choice:
    if not _is_map(data):
        raise where.fail(field, f"expected {{variant, params}}, got {_type(data)}")
    _no_unknown(data, ("variant", "params"), where, prefix=f"{field}.")
    return _named_choice(data.get("variant"), data.get("params") or {}, where, field, problem,
                         backend, choices)


def _named_choice(name: Any, params: Any, where: _Where, field: str, problem: Problem,
                  backend: str, choices: _Choices | None) -> Choice:
    if not isinstance(name, str):
        raise where.fail(f"{field}.variant", f"expected a variant name, got {_type(name)}")
    memo = None
    if choices is not None and type(params) is dict:
        types = tuple(map(type, params.values()))
        if _MEMO_TYPES.issuperset(types):
            memo = (problem.op, name, tuple(params.items()), types)
            hit = choices.get(memo)
            if hit is not None:
                return hit
    choice = _check_choice(name, params, where, field, problem, backend)
    if memo is not None:
        choices[memo] = choice
    return choice


def _check_choice(name: str, params: Any, where: _Where, field: str, problem: Problem,
                  backend: str) -> Choice:
    try:
        variant = registry.get_variant(problem.op, backend, name)
    except UsageError as exc:
        raise where.fail(f"{field}.variant", exc.message, exc.hint) from None
    if not isinstance(params, Mapping):
        raise where.fail(f"{field}.params", f"expected a mapping, got {_type(params)}")
    for k, v in params.items():
        if not isinstance(k, str):
            raise where.fail(f"{field}.params", f"parameter names must be text, got {_type(k)}")
        allowed = variant.params.get(k, ())
        if allowed and not any(type(v) is type(a) and v == a for a in allowed):
            raise where.fail(f"{field}.params.{k}", f"{_short(v)} is not one of {list(allowed)} "
                             f"for {problem.op}/{name}")
    reason = variant.check_params(dict(params))
    if reason:
        raise where.fail(f"{field}.params", reason)
    return Choice.of(name, dict(params))


def _alternative(data: Any, where: _Where, field: str, problem: Problem, backend: str,
                 choices: _Choices | None = None) -> Alternative | None:
    if data is None:
        return None
    if not _is_map(data):
        raise where.fail(field, f"expected {{variant, params, median_us}}, got {_type(data)}")
    _no_unknown(data, ("variant", "params", "median_us"), where, prefix=f"{field}.")
    choice = _named_choice(data.get("variant"), data.get("params") or {}, where, field,
                           problem, backend, choices)
    med = data.get("median_us")
    return Alternative(choice, None if med is None else
                       _num(med, where, f"{field}.median_us", 0.0, MAX_US))


_TIMING_FIELDS = ("median_us", "p20_us", "p80_us", "n")


def _timing(data: Any, where: _Where) -> Timing:
    if not _is_map(data):
        raise where.fail("stats", f"expected {{median_us, p20_us, p80_us, n}}, got "
                         f"{_type(data)}")
    _no_unknown(data, _TIMING_FIELDS, where, prefix="stats.")
    vals = []
    for f in ("median_us", "p20_us", "p80_us"):
        if f not in data:
            raise where.fail(f"stats.{f}", "is missing")
        vals.append(_num(data[f], where, f"stats.{f}", 0.0, MAX_US))
    median, p20, p80 = vals
    n = _int(data.get("n", 0), where, "stats.n", 0, MAX_COUNT)
    if not p20 <= median <= p80:
        raise where.fail("stats", "needs p20_us <= median_us <= p80_us")
    return Timing(median, p20, p80, n)


# ----------------------------------------------------------------------------- scalars


def _record(data: Any, what: str, allowed: tuple[str, ...], required: tuple[str, ...],
            where: _Where) -> None:
    """``data`` is a mapping of known fields with every required one (errors name the
    first required field when ``data`` is not a mapping at all)."""
    if not _is_map(data):
        raise where.fail(required[0], f"{what} must be a mapping, got {_type(data)}")
    _no_unknown(data, allowed, where)
    for f in required:
        if f not in data:
            raise where.fail(f, "is missing")


def _is_map(v: Any) -> bool:
    return type(v) is dict or isinstance(v, Mapping)  # the ABC check only when not a dict


_KNOWN: dict[tuple[str, ...], frozenset[str]] = {}


def _no_unknown(data: Mapping[Any, Any], allowed: tuple[str, ...], where: _Where,
                prefix: str = "") -> None:
    known = _KNOWN.get(allowed)
    if known is None:
        known = _KNOWN[allowed] = frozenset(allowed)
    if known.issuperset(data):
        return
    for k in data:
        if k not in allowed:
            raise where.fail(f"{prefix}{k}", "unknown field",
                             f"known fields: {', '.join(allowed)}")


def _int(v: Any, where: _Where, field: str, lo: int, hi: int) -> int:
    if type(v) is not int and (isinstance(v, bool) or not isinstance(v, int)):
        raise where.fail(field, f"expected an integer, got {_type(v)} {_short(v)}")
    if not lo <= v <= hi:
        raise where.fail(field, f"{_short(v)} is out of range [{lo}, {hi}]")
    return v


def _num(v: Any, where: _Where, field: str, lo: float, hi: float) -> float:
    if type(v) is not float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise where.fail(field, f"expected a number, got {_type(v)} {_short(v)}")
        try:
            v = float(v)
        except OverflowError:  # an integer of hundreds of digits
            raise where.fail(field, f"{_short(v)} is out of range [{lo:g}, {hi:g}]") from None
    if not lo <= v <= hi or not math.isfinite(v):
        raise where.fail(field, f"{_short(v)} is out of range [{lo:g}, {hi:g}]")
    return v


def _bool(v: Any, where: _Where, field: str) -> bool:
    if not isinstance(v, bool):
        raise where.fail(field, f"expected true or false, got {_type(v)} {_short(v)}")
    return v


def _text(v: Any, where: _Where, field: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise where.fail(field, f"expected text, got {_type(v)}")
    s = str(v)
    if len(s) > MAX_TEXT:
        raise where.fail(field, f"text of {len(s)} characters is too long (max {MAX_TEXT})")
    return s


def _type(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
