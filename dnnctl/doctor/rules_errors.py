"""The error messages a user saw (snapshot ``errors``, doctor --error / --error-file): what
each means and, where the snapshot decides it, which of its causes this is.

Each message is matched against the catalogue (compat/errors.yaml, dnnctl.compat.errors).
Every cause of its row is then looked for, in this order:

- a finding of the other rules that establishes it (its ``codes``): the error finding then
  points at that finding (info, ``see``) instead of repeating it;
- the facts the message itself states (``implies``: the compute capability torch names, the
  CUDA version a driver reports, cuInit's CUDA_ERROR_UNKNOWN), added to a copy of the snapshot
  where it says nothing of them and judged again, unless a finding already explains the
  message: a finding that appears only then names the cause;
- the cause's own check (``fact``, dnnctl.doctor.error_facts): yes, likely, ruled out or
  unknown.

A cause the snapshot shows is an error with that cause's fix; otherwise a warning lists the
causes it leaves open, each with how to tell it from the others, and those it rules out. A
message no row matches is listed as not recognized (``not-judged``): never a guess.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from dnnctl.compat.errors import ErrorMatch, match_error, shown
from dnnctl.doctor import error_facts_env  # noqa: F401 - registers its checks
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.error_facts import LIKELY, NO, YES, Outcome, cuda_of, evaluate, message_cc
from dnnctl.doctor.model import EnvSnapshot, Finding, Gpu

COMPONENT = "errors"
Rejudge = Callable[[EnvSnapshot], list[Finding]]
UNRECOGNIZED_FIX = ("look the message up in the issue tracker of the program that printed it; "
                    "a catalogue row for it can be added with --matrix extra.yaml (table "
                    "error_messages, compat/README.md)")


def check(ctx: Context, found: list[Finding], rejudge: Rejudge | None = None) -> list[Finding]:
    """One finding per catalogue row the snapshot's error messages match (several messages of
    one row, e.g. two lines of one NCCL failure, are judged once), one per unknown message."""
    out: list[Finding] = []
    rows: dict[str, list[ErrorMatch]] = {}
    seen: set[str] = set()
    for text in ctx.env.errors:
        quoted = shown(text)
        if not quoted or quoted in seen:
            continue
        seen.add(quoted)
        m = match_error(ctx.matrix, text)
        if m is None:
            out.append(finding("not-judged", "info", COMPONENT,
                               f"'{quoted}' is not in the error catalogue (compat/errors.yaml): "
                               "not recognized, so not judged", fix=UNRECOGNIZED_FIX))
        elif m.id in rows:
            rows[m.id].append(m)
        else:
            rows[m.id] = [m]
            out.append(_judge(ctx, found, m, rejudge))
    for same in rows.values():
        if len(same) > 1:
            f = next(x for x in out if x.evidence.get("error_row") == same[0].id)
            f.message += " (also: " + "; ".join(f"'{shown(x.text)}'" for x in same[1:]) + ")"
            f.evidence["messages"] = len(same)
    return out


PLACEHOLDER = re.compile(r"\{(\w+)(?:\|([^{}]*))?\}")


def fill(text: str, m: ErrorMatch) -> str:
    """A catalogue text with the message's captures put in: ``{major}``, or ``{major|words}``
    with words standing in where the pattern that matched has no such group."""
    return PLACEHOLDER.sub(lambda x: m.groups.get(x.group(1)) or (
        x.group(2) if x.group(2) is not None else "?"), text)


def _cites(f: Finding, codes: list[str]) -> bool:
    if f.severity not in ("error", "warning"):
        return False
    # "code", "code@component", "...#evidence-key", "...~word" (its message says the word)
    for code in codes:
        code, _, word = code.partition("~")
        code, _, key = code.partition("#")
        name, _, comp = code.partition("@")
        if f.code == name and (not comp or f.component == comp) and (
                not key or key in f.evidence) and (
                not word or word.lower() in f.message.lower()):
            return True
    return False


def _judge(ctx: Context, found: list[Finding], m: ErrorMatch,
           rejudge: Rejudge | None) -> Finding:
    row = m.row
    refs_of = [[f for f in found if f.component != COMPONENT
                and _cites(f, list(c.get("codes") or []))] for c in row["causes"]]
    # what the message states is added only where no finding explains it already
    implied, given = ([], "") if any(refs_of) else _implied(ctx, found, m, rejudge)
    verdicts: list[tuple[dict[str, Any], Outcome, list[Finding]]] = []
    for cause, refs in zip(row["causes"], refs_of):
        codes = list(cause.get("codes") or [])
        new = [f for f in implied if _cites(f, codes)]
        firm = [f for f in refs if not f.evidence.get("conditional")]
        if firm:
            outcome = Outcome(YES, "; ".join(f"{f.message} [{f.code}]" for f in firm[:1]))
            refs = firm
        elif refs:  # a finding that said "if ...": the message shows the condition holds,
            f = refs[0]  # unless the cause's own check is soft (the message does not prove it)
            soft = any(p.strip().endswith("?") for p in (cause.get("fact") or "").split("|"))
            outcome = Outcome(LIKELY if soft else YES,
                              f"the message {'fits' if soft else 'confirms'} the condition of "
                              f"[{f.code}] under {f.component}", fix=f.fix, evidence={
                                  "confirms": [f"{x.code} ({x.component})" for x in refs]})
            refs = []
        elif new:
            outcome = Outcome(YES, f"given {given}: {new[0].message}", fix=new[0].fix)
        else:
            outcome = evaluate(fill(cause.get("fact") or "", m), ctx, m)
        verdicts.append((cause, outcome, refs))
    quoted = shown(m.text)
    head = f"'{quoted}': {fill(row['meaning'], m)}"
    ev: dict[str, Any] = {"error_row": m.id}
    ev.update({k: v for k, v in m.groups.items() if len(v) <= 60})
    yes = [(c, o, r) for c, o, r in verdicts if o.state == YES]
    if yes:
        return _decided(row, head, yes, implied, m, ev)
    return _open(row, head, verdicts, m, ev)


def _decided(row: Any, head: str, yes: list, implied: list[Finding], m: ErrorMatch,
             ev: dict[str, Any]) -> Finding:
    refs = [f for _, _, r in yes for f in r]
    parts, fixes = [], []
    for cause, outcome, r in yes:
        if r:
            parts.append(f"{_clause(cause['cause'], m)} (see [{r[0].code}] under "
                         f"{r[0].component})")
        else:
            parts.append(f"{_clause(cause['cause'], m)}: {outcome.says}")
            fixes.append(outcome.fix or fill(cause.get("fix") or row["fix"], m))
        ev.update(outcome.evidence)
    own = len(refs) < len(yes)
    if refs:
        ev["see"] = sorted({f"{f.code} ({f.component})" for f in refs})
    sources = [row["source"]] + [f.source for f in implied if f.source and own]
    message = f"{head}. Cause here: " + "; and ".join(parts)
    fix = "; or ".join(dict.fromkeys(fixes)) if fixes else \
        f"follow the fix of [{refs[0].code}] under {refs[0].component}"
    severity = row.get("severity") or "error"  # (warning: the program's choice, not the setup)
    return finding("error-message", severity if own else "info", COMPONENT, message, fix=fix,
                   source="; ".join(dict.fromkeys(sources)), **ev)


def _open(row: Any, head: str, verdicts: list, m: ErrorMatch, ev: dict[str, Any]) -> Finding:
    likely = [(c, o) for c, o, _ in verdicts if o.state == LIKELY]
    unsure = [(c, o) for c, o, _ in verdicts if o.state is None]
    ruled = [(c, o) for c, o, _ in verdicts if o.state == NO]
    text = head + "."
    for _, o in likely:
        ev.update(o.evidence)
    if likely:
        text += " Likely here: " + "; ".join(f"{_clause(c['cause'], m)} ({o.says})"
                                             for c, o in likely) + "."
    listed = unsure
    if listed:
        text += " Possible causes the snapshot does not decide: " + "; ".join(
            f"({i}) {_clause(c['cause'], m)}"
            + (f" - check: {fill(c['tell'], m)}" if c.get("tell") else "")
            for i, (c, _) in enumerate(listed, 1)) + "."
    if ruled:
        text += " Ruled out here: " + "; ".join(f"{_clause(c['cause'], m)} ({o.says})"
                                                for c, o in ruled) + "."
    if not likely and not unsure:
        text += " None of the catalogue's causes fits this snapshot."
    fix = likely[0][0].get("fix") if likely and likely[0][0].get("fix") else row["fix"]
    ev["candidates"] = len(likely) + len(unsure)
    return finding("error-message", "warning", COMPONENT, text, fix=fill(fix, m),
                   source=row["source"], **ev)


def _clause(text: str, m: ErrorMatch) -> str:
    return fill(text, m).rstrip(". ")


def _implied(ctx: Context, found: list[Finding], m: ErrorMatch,
             rejudge: Rejudge | None) -> tuple[list[Finding], str]:
    """The findings that appear once the facts the message states are added to a copy of the
    snapshot that lacks them, and what was added ("the compute capability 3.5 ...")."""
    wants = m.row.get("implies") or []
    if rejudge is None or not wants:
        return [], ""
    env = copy.deepcopy(ctx.env)
    env.errors = []
    said = []
    cc = message_cc(m)
    if "gpu_cc" in wants and cc is not None and not any(g.cc for g in ctx.gpus):
        if env.gpus:
            for g in env.gpus:
                g.compute_capability = str(cc)
        else:
            env.gpus = [Gpu(compute_capability=str(cc))]
        said.append(f"the compute capability {cc} the message names")
    cuda = cuda_of(m.groups.get("driver_cuda"))
    if "driver_cuda" in wants and cuda is not None and ctx.driver is None and \
            not (ctx.env.driver or {}).get("cuda"):
        env.driver = {**(env.driver or {}), "cuda": str(cuda)}
        said.append(f"the driver's CUDA {cuda} the message names")
    if "cuinit" in wants and m.groups.get("cuinit") and not (ctx.env.driver or {}).get("cuinit"):
        env.driver = {**(env.driver or {}), "cuinit": {"code": 999, "name": "CUDA_ERROR_UNKNOWN"}}
        said.append("cuInit's CUDA_ERROR_UNKNOWN the message names")
    if not said:
        return [], ""
    before = {(f.code, f.component, f.message) for f in found}
    new = [f for f in rejudge(env) if (f.code, f.component, f.message) not in before
           and f.severity in ("error", "warning")]
    return new, " and ".join(said)
