"""A plan loaded for use at run time: section selection, lookup, fallback, stats.

Lookup order (DESIGN.md): the exact key -> the nearest entry of the same op whose variant
supports the shape -> ``None`` (the dispatcher then runs the op's default heuristic).

*Nearest* is documented and conservative: same op and the same non-numeric key fields
(dtype, layout, flags, mode, ...), then the smallest sum over numeric fields of
``|log2((a + 1) / (b + 1))|``; the entry's variant must ``supports()`` the new shape and
accept its parameters (``valid_params``). The answer is memoized, so a repeated key costs a
dict lookup too.

A section is used only when its device fingerprint matches the running device and its
kernels digest matches this dnnctl's kernels; otherwise the plan is *stale* for that device:
a :class:`StalePlanWarning` and the fallback, or :class:`StalePlanError` in strict mode.
Never a wrong kernel.
"""

from __future__ import annotations

import atexit
import math
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend, parse_device
from dnnctl.errors import DnnctlError, StalePlanError, UsageError
from dnnctl.files import gcpause
from dnnctl.ops import registry
from dnnctl.ops.base import Choice, Problem
from dnnctl.plan.digest import kernels_digest
from dnnctl.plan.io import read_plan
from dnnctl.plan.schema import Plan, PlanEntry, Section, device_differences, same_device
from dnnctl.plan.support import UnsupportedEntryWarning, entry_label, unsupported


class StalePlanWarning(UserWarning):
    """The plan has no usable section for this device; calls fall back to the heuristics."""


class _Hit:
    """An exact entry's choice and its call counter (one hash per planned call)."""

    __slots__ = ("choice", "calls")

    def __init__(self, choice: Choice):
        self.choice = choice
        self.calls = 0


@dataclass
class _Table:
    """The lookup tables of one section, for one (backend, device index)."""

    section: Section | None
    status: str  # "ok" | "stale" | "missing"
    reason: str = ""
    exact: dict[Problem, _Hit] = field(default_factory=dict)
    by_op: dict[str, list[PlanEntry]] = field(default_factory=dict)
    near: dict[Problem, tuple[Choice, PlanEntry] | None] = field(default_factory=dict)


@dataclass
class PlanStats:
    """Calls per key: served exactly (hits), by a nearest entry (fallbacks), or by the
    op's default heuristic (misses)."""

    hits: dict[Problem, int]
    fallbacks: dict[Problem, int]
    misses: dict[Problem, int]

    @property
    def total(self) -> int:
        return sum(self.hits.values()) + sum(self.fallbacks.values()) + sum(
            self.misses.values())

    def to_dict(self) -> dict[str, Any]:
        def rows(d: dict[Problem, int]) -> list[dict[str, Any]]:
            return [{"op": p.op, "key": p.as_dict(), "calls": n} for p, n in d.items()]
        return {"hits": sum(self.hits.values()), "fallbacks": sum(self.fallbacks.values()),
                "misses": sum(self.misses.values()),
                "by_key": {"hits": rows(self.hits), "fallbacks": rows(self.fallbacks),
                           "misses": rows(self.misses)}}

    def __repr__(self) -> str:
        return (f"PlanStats(hits={sum(self.hits.values())}, "
                f"fallbacks={sum(self.fallbacks.values())}, "
                f"misses={sum(self.misses.values())}, keys={len(self.hits) + len(self.fallbacks) + len(self.misses)})")


class LoadedPlan:
    """A validated plan ready for ``dnnctl.ops`` calls (``plan=`` or ``use_plan``)."""

    def __init__(self, plan: Plan, *, strict: bool = False,
                 record_misses: str | Path | None = None, digest: str | None = None):
        self.plan = plan
        self.path = plan.source
        self.strict = strict
        self.digest = digest or kernels_digest()
        self.record_misses = Path(record_misses) if record_misses else None
        self._tables: dict[tuple[str, int], _Table] = {}
        self._last: tuple[Any, _Table | None] = (None, None)  # (device object, its table)
        # bumped whenever a table is rebound: what a caller holding an entry's hit
        # (:meth:`exact_hit`) checks before it trusts it
        self.generation = 0
        self._fallbacks: dict[Problem, int] = {}
        self._misses: dict[Problem, int] = {}
        self._lock = threading.Lock()
        self._recorded: set[Problem] = set()
        self._baselines: dict[Path, Any] = {}
        self._atexit = False

    # ------------------------------------------------------------------ selection

    def select(self, backend: str, device: DeviceInfo) -> _Table:
        """Choose (once) the section for ``device``; warn, or raise when strict, if stale."""
        ck = (backend, device.index)
        table = self._tables.get(ck)
        if table is not None:
            return table
        with self._lock:
            table = self._tables.get(ck) or self._build_table(backend, device)
            self._tables[ck] = table
        if table.status != "ok":
            msg = f"plan {self.path} is stale for {backend} device {device.index} " \
                  f"({device.name}): {table.reason}"
            if self.strict:
                raise StalePlanError(msg, hint="re-run 'dnnctl tune' on this machine, or load "
                                     "with strict=False to fall back to the default heuristics")
            warnings.warn(msg + "; falling back to the default heuristics", StalePlanWarning,
                          stacklevel=3)
        return table

    def _build_table(self, backend: str, device: DeviceInfo) -> _Table:
        fp = device.fingerprint()
        same_backend = [s for s in self.plan.sections if s.backend == backend]
        if not same_backend:
            have = ", ".join(s.label() for s in self.plan.sections) or "none"
            return _Table(None, "missing", f"no section for the {backend} backend "
                          f"(sections: {have})")
        matching = [s for s in same_backend if same_device(s.device, fp)]
        if not matching:
            diffs = min((device_differences(s.device, fp) for s in same_backend), key=len)
            return _Table(None, "stale", "made on another device or software stack ("
                          + "; ".join(diffs) + ")")
        current = [s for s in matching if s.kernels_digest == self.digest]
        if not current:
            return _Table(None, "stale", "made with other kernels / timing harness "
                          f"(kernels_digest {matching[0].kernels_digest[:19]}..., this dnnctl "
                          f"{self.digest[:19]}...)")
        return _table_of(current[0], device, self.path)

    def bind_section(self, section: Section, device: DeviceInfo) -> None:
        """Use ``section`` for ``device`` whatever its fingerprint (offline tools such as
        coverage judge a GPU plan on another machine)."""
        self._tables[(section.backend, device.index)] = _table_of(section, device, self.path)
        self._last = (None, None)
        self.generation += 1

    def section_for(self, backend: str, device: DeviceInfo) -> Section | None:
        """The section used for ``device`` (None when stale or absent)."""
        return self.select(backend, device).section

    # ------------------------------------------------------------------ lookup

    def lookup(self, problem: Problem, backend: str, device: DeviceInfo) -> Choice | None:
        """The planned choice for ``problem``, or None for the default heuristic."""
        last = self._last  # one read: (device, table) always belong together
        if last[0] is device and last[1] is not None:
            table = last[1]
        else:
            table = self._tables.get((backend, device.index))
            if table is None:
                table = self.select(backend, device)
            self._last = (device, table)
        hit = table.exact.get(problem)
        if hit is not None:
            hit.calls += 1
            return hit.choice
        return self._lookup_slow(table, problem, backend, device)

    def exact_hit(self, problem: Problem, backend: str, device: DeviceInfo) -> _Hit | None:
        """``problem``'s exact entry (its choice and call counter: a caller that keeps it
        counts its calls there), None where it has none; not counted. Valid while
        :attr:`generation` stays."""
        return self.select(backend, device).exact.get(problem)

    def _lookup_slow(self, table: _Table, problem: Problem, backend: str, device: DeviceInfo
                     ) -> Choice | None:
        if problem in table.near:
            found = table.near[problem]
        else:
            found = nearest(table, problem, backend, device)
            table.near[problem] = found
        if found is not None:
            self._fallbacks[problem] = self._fallbacks.get(problem, 0) + 1
        else:
            self._misses[problem] = self._misses.get(problem, 0) + 1
        if self.record_misses is not None:
            self._record(problem)
        return found[0] if found is not None else None

    def explain(self, problem: Problem, backend: str, device: DeviceInfo
                ) -> tuple[str, Choice | None, PlanEntry | None]:
        """('hit' | 'fallback' | 'miss', choice, entry) for ``problem``, without counting."""
        table = self.select(backend, device)
        if problem in table.exact:
            section = table.section
            entry = section.find(problem) if section is not None else None
            return "hit", table.exact[problem].choice, entry
        found = table.near.get(problem) if problem in table.near else nearest(
            table, problem, backend, device)
        if found is None:
            return "miss", None, None
        return "fallback", found[0], found[1]

    # ------------------------------------------------------------------ stats & misses

    def stats(self) -> PlanStats:
        """Calls so far per key: hits, fallbacks (nearest entry) and misses (heuristic)."""
        hits: dict[Problem, int] = {}
        for table in list(self._tables.values()):
            for p, h in table.exact.items():
                if h.calls:
                    hits[p] = hits.get(p, 0) + h.calls
        return PlanStats(hits, dict(self._fallbacks), dict(self._misses))

    def reset_stats(self) -> None:
        for table in self._tables.values():
            for h in table.exact.values():
                h.calls = 0
        self._fallbacks.clear()
        self._misses.clear()

    def _record(self, problem: Problem) -> None:
        if problem in self._recorded:
            return
        self._recorded.add(problem)
        if not self._atexit:
            atexit.register(self._save_at_exit)
            self._atexit = True
        self.save_misses()

    def _save_at_exit(self) -> None:
        try:
            self.save_misses()
        except DnnctlError as exc:  # the error was raised at the call already
            warnings.warn(f"could not record plan misses: {exc}", stacklevel=1)

    def save_misses(self, path: str | Path | None = None) -> Path | None:
        """Write every key the plan did not cover exactly as a workload for the next tune.

        Problems already in the file when this plan first wrote it are kept, and counts add
        up across runs of the program.
        """
        target = Path(path) if path is not None else self.record_misses
        if target is None:
            return None
        from dnnctl.workloads.model import Workload, read_workload, write_workload

        with self._lock:
            base = self._baselines.get(target)
            if base is None:
                base = Workload("plan-misses")
                if target.exists():
                    try:
                        base = read_workload(target)
                    except Exception:  # a broken misses file is replaced, never fatal
                        pass
                self._baselines[target] = base
            wl = Workload(base.name, list(base.items))
            for counts in (self._fallbacks, self._misses):
                for p, n in list(counts.items()):
                    wl.add(p, count=n)
            write_workload(wl, target)
        return target

    def __repr__(self) -> str:
        n = sum(len(s.entries) for s in self.plan.sections)
        return f"LoadedPlan({self.path!r}, sections={len(self.plan.sections)}, entries={n})"


def _table_of(section: Section, device: DeviceInfo, source: str) -> _Table:
    """Lookup tables of ``section``; entries whose variant does not support their key on
    ``device`` are left out with an UnsupportedEntryWarning naming each (never run)."""
    from dnnctl.ops.dispatch import intern

    table = _Table(section, "ok")
    with gcpause.paused():  # a large plan: tens of thousands of checks and table rows
        bad = {id(e): (i, reason) for i, e, reason in unsupported(section, device)}
        for i, e in enumerate(section.entries):
            if id(e) in bad:
                warnings.warn(f"plan {source}: ignoring {entry_label(i, e)}: "
                              f"{bad[id(e)][1]}", UnsupportedEntryWarning, stacklevel=4)
                continue
            # the dispatcher hands us its interned problem objects: dict hits by identity
            table.exact[intern(e.problem)] = _Hit(e.choice)
            table.by_op.setdefault(e.problem.op, []).append(e)
    return table


def nearest(table: _Table, problem: Problem, backend: str, device: DeviceInfo
            ) -> tuple[Choice, PlanEntry] | None:
    """The closest usable entry of the same op (see module doc), or None."""
    entries = table.by_op.get(problem.op)
    if not entries:
        return None
    scored = []
    for i, e in enumerate(entries):
        d = key_distance(problem, e.problem)
        if d is not None:
            scored.append((d, i, e))
    scored.sort(key=lambda t: (t[0], t[1]))
    for _, _, e in scored:
        try:
            variant = registry.get_variant(problem.op, backend, e.choice.variant)
            if not variant.supports(problem, device):
                continue
            if not variant.valid_params(problem, e.choice.param_dict, device):
                continue
        except Exception:  # a variant that cannot judge the shape is not used for it
            continue
        return e.choice, e
    return None


def key_distance(a: Problem, b: Problem) -> float | None:
    """Distance between two keys of one op; None when a non-numeric field differs."""
    if a.op != b.op or len(a.key) != len(b.key):
        return None
    d = 0.0
    for (na, va), (nb, vb) in zip(a.key, b.key):
        if na != nb:
            return None
        if va == vb:
            continue
        if _is_int(va) and _is_int(vb):
            d += _logdist(va, vb)
        elif isinstance(va, tuple) and isinstance(vb, tuple) and len(va) == len(vb) and all(
                _is_int(x) and _is_int(y) for x, y in zip(va, vb)):
            d += sum(_logdist(x, y) for x, y in zip(va, vb))
        else:
            return None
    return d


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _logdist(x: int, y: int) -> float:
    return abs(math.log2((abs(x) + 1) / (abs(y) + 1)))


def load_plan(path: str | Path, strict: bool = False, device: Any = None,
              record_misses: str | Path | None = None) -> LoadedPlan:
    """Load and validate a plan; select (and check) the section for the running device.

    ``device``: a DeviceInfo, or 'cuda:N' / 'cpu' / 'auto' (default: the best device here).
    A stale plan gives a StalePlanWarning and falls back to the default heuristics; with
    ``strict=True`` it raises StalePlanError. ``record_misses=PATH`` writes every key the
    plan does not cover exactly as a dnnctl-workload/1 file for the next ``dnnctl tune``.
    """
    if not isinstance(path, (str, Path)):
        raise UsageError(f"load_plan: expected the path of a plan file, got "
                         f"{type(path).__name__}", hint="dnnctl.load_plan('model.plan.yaml')")
    plan = read_plan(path)
    loaded = LoadedPlan(plan, strict=strict, record_misses=record_misses)
    if isinstance(device, DeviceInfo):
        info = device
    else:
        backend_name, index = parse_device(device)
        backend = get_backend(backend_name)
        ok, _ = backend.availability()
        if not ok:
            return loaded  # checked lazily on the first call of a usable backend
        info = backend.device(index)
    loaded.select(info.backend, info)
    return loaded
