"""``dnnctl plan report``: one self-contained HTML file (figures embedded as PNG data URIs;
no network needed to view it) explaining what a plan chose, per device section:

- the winner's speed-up over the default heuristic and over the vendor library, per problem;
- each recorded candidate's time (winner with its p20-p80 spread, runner-up, default);
- achieved TFLOP/s or GB/s against measured ceilings (a roofline);
- with another plan, what changed (``against``).
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path
from typing import Any

from dnnctl.errors import UsageError
from dnnctl.files.yamlio import write_atomic
from dnnctl.ops import registry
from dnnctl.plan.compare import _pair_sections
from dnnctl.plan.io import read_plan
from dnnctl.plan.schema import Plan, PlanEntry, Section
from dnnctl.workloads import short_key


def is_vendor(op: str, variant: str) -> bool:
    """The variant calls a vendor library (cuBLAS, cuDNN, torch's backends) rather than
    dnnctl's own kernels: its registry flag, on any backend."""
    return any(v.vendor for v in registry.variants(op) if v.name == variant)


def key_text(entry: PlanEntry) -> str:
    """The key fields that differ from the op's defaults, compactly."""
    return short_key(entry.problem)


def entry_row(entry: PlanEntry) -> dict[str, Any]:
    """What the figures and tables show for one plan entry."""
    op = registry.get_op(entry.problem.op)
    med = entry.stats.median_us if entry.stats else None
    flops, nbytes = float(op.flops(entry.problem)), float(op.min_bytes(entry.problem))
    cands = []
    if entry.stats is not None:
        cands.append({"role": "winner", "label": entry.choice.label(), "median_us": med,
                      "p20_us": entry.stats.p20_us, "p80_us": entry.stats.p80_us})
    for role, alt in (("runner-up", entry.runner_up), ("default", entry.default)):
        if alt is not None and alt.median_us:
            cands.append({"role": "vendor" if is_vendor(entry.problem.op, alt.choice.variant)
                          else role, "label": alt.choice.label(), "median_us": alt.median_us})
    vendor = [c["median_us"] for c in cands if c["role"] == "vendor"]
    if is_vendor(entry.problem.op, entry.choice.variant) and med:
        vendor.append(med)
    return {"op": entry.problem.op, "label": f"{entry.problem.op} {key_text(entry)}",
            "choice": entry.choice.label(), "median_us": med, "candidates": cands,
            "x_default": entry.speedup_vs_default(),
            "x_vendor": min(vendor) / med if vendor and med else None,
            "flops": flops, "bytes": nbytes,
            "tflops": flops / med / 1e6 if med and flops else None,
            "gbps": nbytes / med / 1e3 if med else None, "tried": entry.tried,
            "pinned": entry.pinned}


def build_report(plan_path: str | os.PathLike[str], output: str | os.PathLike[str], *,
                 png_dir: str | os.PathLike[str] | None = None,
                 against: str | os.PathLike[str] | None = None,
                 ceilings: dict[str, float] | None = None) -> dict[str, Any]:
    """Write the HTML report of ``plan_path`` (and each figure as a PNG under ``png_dir``);
    return what was written: figures per section, problems, files."""
    from dnnctl.plan import report_figures as figs

    plan = read_plan(plan_path)
    old = read_plan(against) if against is not None else None
    ceil = dict(ceilings or {})
    figures: list[tuple[str, bytes]] = []
    parts = [_head(str(plan_path), ceil, against)]
    summary = []
    for i, section in enumerate(plan.sections):
        rows = [entry_row(e) for e in sorted(section.entries, key=lambda e: (
            e.problem.op, -(e.stats.median_us if e.stats else 0)))]
        tag = f"s{i}"
        sec_figs = [(f"{tag}-speedup", figs.speedups(rows, f"{section.label()}: speed-up "
                                                           "per problem")),
                    (f"{tag}-roofline", figs.roofline(rows, ceil, section.label()))]
        problem_figs = [(f"{tag}-p{j:03d}-{_slug(r['label'])}", figs.candidates(r))
                        for j, r in enumerate(rows) if r["candidates"]]
        changes = _changes(section, old) if old is not None else None
        if changes:
            sec_figs.append((f"{tag}-against", figs.against(changes, "against "
                                                             + html.escape(str(against)))))
        figures += sec_figs + problem_figs
        parts.append(_section_html(i, section, rows, sec_figs, problem_figs, changes))
        summary.append({"index": i, "label": section.label(), "problems": len(rows),
                        "figures": len(sec_figs) + len(problem_figs)})
    parts.append("</body></html>\n")
    write_atomic(output, "".join(parts))
    pngs = []
    if png_dir is not None:
        Path(png_dir).mkdir(parents=True, exist_ok=True)
        for name, data in figures:
            path = Path(png_dir) / f"{name}.png"
            path.write_bytes(data)
            pngs.append(str(path))
    return {"schema": "dnnctl-plan-report/1", "plan": str(plan_path), "output": str(output),
            "against": None if against is None else str(against), "ceilings": ceil,
            "sections": summary, "pngs": pngs}


def parse_ceilings(text: str | None) -> dict[str, float]:
    """``"4249,634"`` -> {"gbps": 4249.0, "tflops": 634.0} (measured copy GB/s, TFLOP/s)."""
    if not text:
        return {}
    try:
        gbps, tflops = (float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--ceilings {text!r} must be GBPS,TFLOPS",
                         hint="e.g. --ceilings 4249,634 (measured copy bandwidth, GEMM peak)"
                         ) from None
    if gbps <= 0 or tflops <= 0:
        raise UsageError(f"--ceilings {text!r}: both values must be positive")
    return {"gbps": gbps, "tflops": tflops}


def _changes(section: Section, old: Plan) -> list[dict[str, Any]]:
    """Problems in this section and the matching section of ``old`` with their times."""
    new_plan = Plan([section])
    rows = []
    for sa, sb in _pair_sections(new_plan, old):
        if sa is not section or sb is None:
            continue
        for e in section.entries:
            o = sb.find(e.problem)
            if o is None or not (o.stats and e.stats):
                continue
            rows.append({"label": f"{e.problem.op} {key_text(e)}", "new_us": e.stats.median_us,
                         "old_us": o.stats.median_us, "changed": o.choice != e.choice,
                         "new": e.choice.label(), "old": o.choice.label()})
    return rows


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text)[:48].strip("-")


def _img(name: str, data: bytes, alt: str) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return (f'<figure id="{name}"><img alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{b64}"></figure>\n')


def _head(plan: str, ceilings: dict[str, float], against: Any) -> str:
    ceil = (f"measured ceilings: {ceilings['gbps']:g} GB/s copy, {ceilings['tflops']:g} "
            "TFLOP/s" if ceilings else "no measured ceilings given (--ceilings GBPS,TFLOPS)")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>dnnctl plan report: {html.escape(plan)}</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
            "img{max-width:100%}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
            "td.n{text-align:right}</style></head><body>"
            f"<h1>dnnctl plan report</h1><p>plan: <code>{html.escape(plan)}</code>; "
            f"{html.escape(ceil)}"
            + (f"; compared against <code>{html.escape(str(against))}</code>" if against
               else "") + "</p>\n")


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _section_html(i: int, section: Section, rows: list[dict[str, Any]],
                  sec_figs: list[tuple[str, bytes]], problem_figs: list[tuple[str, bytes]],
                  changes: list[dict[str, Any]] | None) -> str:
    out = [f"<h2>section {i}: {html.escape(section.label())}</h2>",
           f"<p>{len(rows)} problems; created {html.escape(section.created)}; kernels "
           f"<code>{html.escape(section.kernels_digest[:19])}…</code></p>"]
    out += [_img(name, data, name) for name, data in sec_figs]
    out.append("<table><tr><th>problem</th><th>winner</th><th>median µs</th><th>× default"
               "</th><th>× vendor</th><th>TFLOP/s</th><th>GB/s</th><th>tried</th></tr>")
    for r in rows:
        out.append(f"<tr><td>{html.escape(r['label'])}</td><td>{html.escape(r['choice'])}"
                   f"</td><td class=n>{_num(r['median_us'], '.2f')}</td><td class=n>"
                   f"{_num(r['x_default'], '.2f')}</td><td class=n>{_num(r['x_vendor'], '.2f')}"
                   f"</td><td class=n>{_num(r['tflops'], '.1f')}</td><td class=n>"
                   f"{_num(r['gbps'], '.0f')}</td><td class=n>{r['tried']}</td></tr>")
    out.append("</table>")
    if changes is not None:
        moved = [c for c in changes if c["changed"]]
        out.append(f"<h3>against the other plan: {len(changes)} problems in both, "
                   f"{len(moved)} with another choice</h3><ul>")
        out += [f"<li>{html.escape(c['label'])}: {html.escape(c['old'])} "
                f"({c['old_us']:.2f} µs) → {html.escape(c['new'])} ({c['new_us']:.2f} µs)"
                "</li>" for c in moved]
        out.append("</ul>")
    out.append("<h3>candidates per problem</h3>")
    out += [_img(name, data, name) for name, data in problem_figs]
    return "\n".join(out) + "\n"
