"""Plan diff and merge, keyed by (device fingerprint, kernels digest, op key).

Merge policy on a conflict (the same key in matching sections of both plans, different
choices): a pinned entry beats an unpinned one; otherwise ``prefer`` decides: ``faster``
(lower median; an entry without timing loses; a tie keeps A), ``newer`` (the section
created later), ``a`` or ``b``. Two pinned entries that disagree are an error unless
``prefer`` is ``a`` or ``b``.
"""

from __future__ import annotations

import copy
from typing import Any

from dnnctl.errors import UsageError
from dnnctl.ops.base import problem_sort_key
from dnnctl.plan.schema import Plan, PlanEntry, Section, same_device

PREFER: tuple[str, ...] = ("faster", "newer", "a", "b")
CHANGE_THRESHOLD = 0.05  # same choice, time moved by more than this: reported as 'retimed'


def _median(e: PlanEntry) -> float | None:
    return e.stats.median_us if e.stats is not None else None


def _row(e: PlanEntry) -> dict[str, Any]:
    return {"op": e.problem.op, "key": e.problem.as_dict(), "choice": e.choice.label(),
            "median_us": _median(e), "pinned": e.pinned}


def _pair_sections(a: Plan, b: Plan) -> list[tuple[Section | None, Section | None]]:
    pairs: list[tuple[Section | None, Section | None]] = []
    used: set[int] = set()
    for sa in a.sections:
        match = None
        for j, sb in enumerate(b.sections):
            if j not in used and same_device(sa.device, sb.device) and \
                    sa.kernels_digest == sb.kernels_digest:
                match = j
                break
        if match is None:
            for j, sb in enumerate(b.sections):
                if j not in used and same_device(sa.device, sb.device):
                    match = j
                    break
        if match is not None:
            used.add(match)
            pairs.append((sa, b.sections[match]))
        else:
            pairs.append((sa, None))
    pairs.extend((None, sb) for j, sb in enumerate(b.sections) if j not in used)
    return pairs


def diff_plans(a: Plan, b: Plan) -> dict[str, Any]:
    """Per device section: entries added, removed, changed (other choice), retimed."""
    sections = []
    for sa, sb in _pair_sections(a, b):
        label = (sa or sb).label()  # type: ignore[union-attr]
        if sa is None or sb is None:
            only = sa or sb
            assert only is not None
            sections.append({"device": label, "status": "only_a" if sb is None else "only_b",
                             "entries": len(only.entries)})
            continue
        ea = {e.problem: e for e in sa.entries}
        eb = {e.problem: e for e in sb.entries}
        added = [_row(eb[p]) for p in sorted(eb.keys() - ea.keys(), key=problem_sort_key)]
        removed = [_row(ea[p]) for p in sorted(ea.keys() - eb.keys(), key=problem_sort_key)]
        changed, retimed, same = [], [], 0
        for p in sorted(ea.keys() & eb.keys(), key=problem_sort_key):
            x, y = ea[p], eb[p]
            if x.choice != y.choice or x.pinned != y.pinned:
                changed.append({"op": p.op, "key": p.as_dict(), "a": x.choice.label(),
                                "b": y.choice.label(), "a_us": _median(x), "b_us": _median(y),
                                "a_pinned": x.pinned, "b_pinned": y.pinned})
            elif _moved(_median(x), _median(y)):
                retimed.append({"op": p.op, "key": p.as_dict(), "choice": x.choice.label(),
                                "a_us": _median(x), "b_us": _median(y)})
            else:
                same += 1
        sections.append({"device": label, "status": "both",
                         "kernels_changed": sa.kernels_digest != sb.kernels_digest,
                         "added": added, "removed": removed, "changed": changed,
                         "retimed": retimed, "same": same})
    identical = all(s["status"] == "both" and not s["kernels_changed"] and not (
        s["added"] or s["removed"] or s["changed"] or s["retimed"]) for s in sections)
    return {"a": a.source, "b": b.source, "identical": identical, "sections": sections}


def _moved(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return (x is None) != (y is None)
    return abs(x - y) > CHANGE_THRESHOLD * max(x, y)


def merge_plans(a: Plan, b: Plan, prefer: str = "faster") -> tuple[Plan, list[dict[str, Any]]]:
    """A new plan with every section and entry of both; returns it and the conflicts."""
    if prefer not in PREFER:
        raise UsageError(f"unknown merge policy {prefer!r}", hint=f"use one of {PREFER}")
    out = Plan([copy.deepcopy(s) for s in a.sections], source="<merged>")
    conflicts: list[dict[str, Any]] = []
    for sb in b.sections:
        target = next((s for s in out.sections if same_device(s.device, sb.device)
                       and s.kernels_digest == sb.kernels_digest), None)
        if target is None:
            out.sections.append(copy.deepcopy(sb))
            continue
        a_created = target.created
        for eb in sb.entries:
            ea = target.find(eb.problem)
            if ea is None:
                target.upsert(copy.deepcopy(eb))
                continue
            if ea.choice == eb.choice and ea.pinned == eb.pinned:
                if prefer == "b" or (prefer == "newer" and sb.created > a_created):
                    target.upsert(copy.deepcopy(eb))
                continue
            keep_b = _prefer_b(ea, eb, prefer, a_created, sb.created)
            conflicts.append({"op": eb.problem.op, "key": eb.problem.as_dict(),
                              "a": ea.choice.label(), "b": eb.choice.label(),
                              "kept": "b" if keep_b else "a"})
            if keep_b:
                target.upsert(copy.deepcopy(eb))
        if sb.created > target.created:
            target.created = sb.created
    return out, conflicts


def _prefer_b(ea: PlanEntry, eb: PlanEntry, prefer: str, a_created: str, b_created: str
              ) -> bool:
    if ea.pinned != eb.pinned:
        return eb.pinned
    if ea.pinned and eb.pinned and prefer not in ("a", "b"):
        raise UsageError(
            f"both plans pin {ea.problem.short()}, to {ea.choice.label()} and "
            f"{eb.choice.label()}", hint="choose with --prefer a or --prefer b")
    if prefer == "a":
        return False
    if prefer == "b":
        return True
    if prefer == "newer":
        return b_created > a_created
    ma, mb = _median(ea), _median(eb)
    if mb is None:
        return False
    return ma is None or mb < ma
