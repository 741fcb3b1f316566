"""``dnnctl tune``: verify and time every candidate of every problem, robustly, offline.

See :func:`dnnctl.tune.tuner.tune` and DESIGN.md "Tuning". Names resolve lazily so that
importing :mod:`dnnctl.tune.timer` (the plan digest does) stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TuneOptions", "TuneReport", "TimingPolicy", "tune"]


def __getattr__(name: str) -> Any:
    if name in ("TuneOptions", "tune"):
        from dnnctl.tune import tuner

        return getattr(tuner, name)
    if name == "TuneReport":
        from dnnctl.tune.report import TuneReport

        return TuneReport
    if name == "TimingPolicy":
        from dnnctl.tune.timer import TimingPolicy

        return TimingPolicy
    raise AttributeError(f"module 'dnnctl.tune' has no attribute {name!r}")
