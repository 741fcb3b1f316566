"""The report's figures, drawn with matplotlib's Agg backend (extra ``dnnctl[plots]``).

Each function takes plain rows (see :mod:`dnnctl.plan.report`) and returns PNG bytes.
"""

from __future__ import annotations

import io
from typing import Any

from dnnctl.errors import UsageError

WIN, RUNNER, DEFAULT, VENDOR, OLD = "#2b6cb0", "#90cdf4", "#a0aec0", "#dd6b20", "#cbd5e0"


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("the plan report draws its figures with matplotlib",
                         hint="pip install 'dnnctl[plots]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight",
                metadata={"Software": None})  # no version text: same plan, same bytes
    _plt().close(fig)
    return buf.getvalue()


def speedups(rows: list[dict[str, Any]], title: str) -> bytes:
    """Per problem: the winner's speed-up over the default heuristic and over the vendor
    library (where the plan measured it), as horizontal bars around 1x."""
    plt = _plt()
    height = max(2.0, 0.28 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(8.5, height))
    ys = range(len(rows))
    dflt = [r["x_default"] or 0.0 for r in rows]
    vend = [r["x_vendor"] or 0.0 for r in rows]
    ax.barh([y + 0.2 for y in ys], dflt, height=0.4, color=WIN, label="vs default heuristic")
    if any(vend):
        ax.barh([y - 0.2 for y in ys], vend, height=0.4, color=VENDOR,
                label="vs vendor library")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(ys), [r["label"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up of the planned winner (x; >1 is faster)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def candidates(row: dict[str, Any]) -> bytes:
    """One problem: each candidate the plan recorded, its median and (winner) p20-p80."""
    plt = _plt()
    cands = row["candidates"]
    fig, ax = plt.subplots(figsize=(6.0, 0.45 * len(cands) + 1.0))
    ys = list(range(len(cands)))
    colors = {"winner": WIN, "runner-up": RUNNER, "default": DEFAULT, "vendor": VENDOR}
    for y, c in zip(ys, cands):
        err = None
        if c.get("p20_us") is not None:
            err = [[c["median_us"] - c["p20_us"]], [c["p80_us"] - c["median_us"]]]
        ax.barh(y, c["median_us"], color=colors.get(c["role"], DEFAULT), xerr=err,
                capsize=3, height=0.6)
        ax.text(c["median_us"], y, f"  {c['median_us']:.4g} us", va="center", fontsize=7)
    ax.set_yticks(ys, [_wrap(f"{c['role']}: {c['label']}") for c in cands], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(c["median_us"] for c in cands) * 1.35)
    ax.set_xlabel("time per call (us; median, bar = p20-p80)")
    ax.set_title(row["label"][:90], fontsize=8)
    return _png(fig)


def _wrap(text: str, width: int = 56) -> str:
    return "\n".join(text[i:i + width] for i in range(0, len(text), width))


def roofline(rows: list[dict[str, Any]], ceilings: dict[str, float], title: str) -> bytes:
    """Achieved TFLOP/s against arithmetic intensity (FLOP per minimum byte), with the
    measured bandwidth and compute ceilings; memory-bound problems also as GB/s."""
    plt = _plt()
    # memory-bound: below the ridge point (10 FLOP/byte without measured ceilings)
    bw, peak = ceilings.get("gbps"), ceilings.get("tflops")
    ridge_at = peak * 1e3 / bw if bw and peak else 10.0
    mem = [r for r in rows if r["bytes"] and r["median_us"]
           and (r["flops"] or 0.0) / r["bytes"] < ridge_at]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8.5, 5.0 + 0.2 * len(mem)),
                                 height_ratios=[4.0, 1.0 + 0.2 * len(mem)])
    pts = [r for r in rows if r["flops"] and r["bytes"] and r["median_us"]]
    by_op: dict[str, list[dict[str, Any]]] = {}
    for r in pts:
        by_op.setdefault(r["op"], []).append(r)
    for op, rs in sorted(by_op.items()):
        ax.scatter([r["flops"] / r["bytes"] for r in rs], [r["tflops"] for r in rs],
                   label=op, s=18)
    if pts:
        lo = min(r["flops"] / r["bytes"] for r in pts) / 2
        hi = max(r["flops"] / r["bytes"] for r in pts) * 2
        if bw and peak:
            ridge = peak * 1e3 / bw
            xs = [lo, max(lo, min(ridge, hi)), hi]
            ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], color="black", linewidth=1,
                    label=f"ceilings: {bw:g} GB/s, {peak:g} TFLOP/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax.set_xlabel("FLOP per byte (minimum bytes moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("every problem", fontsize=9)
    bx.barh(range(len(mem)), [r["gbps"] for r in mem], color=WIN)
    if bw:
        bx.axvline(bw, color="black", linewidth=1, label=f"measured copy {bw:g} GB/s")
        bx.legend(fontsize=7)
    bx.set_yticks(range(len(mem)), [r["label"][:70] for r in mem], fontsize=6)
    bx.invert_yaxis()
    bx.set_xlabel("achieved GB/s (minimum bytes)")
    bx.set_title("memory-bound problems (below the ridge point)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(hspace=0.3)
    return _png(fig)


def against(rows: list[dict[str, Any]], title: str) -> bytes:
    """Problems in both plans: the old and the new winner's median time."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, max(2.0, 0.3 * len(rows) + 1.2)))
    ys = range(len(rows))
    ax.barh([y - 0.2 for y in ys], [r["old_us"] for r in rows], height=0.4, color=OLD,
            label="other plan")
    ax.barh([y + 0.2 for y in ys], [r["new_us"] for r in rows], height=0.4, color=WIN,
            label="this plan")
    ax.set_yticks(list(ys), [r["label"][:50] + (" *" if r["changed"] else "")
                             for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("winner's median time (us, log); * the choice changed")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _png(fig)
