"""Helpers for plan tests: real plans for this machine's numpy device, built in memory from
the real conv2d / matmul ops and their numpy variants (no tuning needed)."""

from __future__ import annotations

from typing import Any

from dnnctl.backends.registry import get_backend
from dnnctl.ops import registry
from dnnctl.ops.base import Choice, Problem
from dnnctl.plan import Alternative, Plan, PlanEntry, Section, Timing, kernels_digest

CONV = {"n": 2, "c": 16, "h": 12, "w": 12, "k": 16, "r": 3, "s": 3, "pad": 1,
        "dtype": "float32", "layout": "NCHW"}


def conv(**changes: Any) -> Problem:
    return registry.get_op("conv2d").problem({**CONV, **changes})


def entry(problem: Problem, variant: str, params: dict[str, Any] | None = None,
          median: float = 100.0, pinned: bool = False) -> PlanEntry:
    return PlanEntry(
        problem, Choice.of(variant, params or {}), Timing(median, median - 2.0,
                                                          median + 3.0, 50),
        runner_up=Alternative(Choice.of("direct", {"order": "tap"}), median * 1.5),
        default=Alternative(Choice.of("im2col_gemm", {"chunk": 0}), median * 1.2),
        tried=7, failed={"wrong": 1, "crashed": 0, "timeout": 0, "oom": 0},
        workspace_bytes=1024, max_rel_err=1.5e-7, pinned=pinned)


def numpy_section(entries: list[PlanEntry], **device_changes: Any) -> Section:
    fp = get_backend("numpy").device(0).fingerprint()
    fp.update(device_changes)
    return Section(fp, kernels_digest(), "2026-01-02T03:04:05Z",
                   {"warmup_ms": 3.0, "budget_ms": 20.0, "statistic": "median"}, entries)


def sample_plan() -> Plan:
    """Three conv2d entries (im2col chunk=0 at n=2, fft at 11x11, direct for depthwise)."""
    return Plan([numpy_section([
        entry(conv(), "im2col_gemm", {"chunk": 0}, 120.0),
        entry(conv(c=4, k=8, h=24, w=24, r=11, s=11, pad=5), "fft", {"size": "fast"}, 300.0),
        entry(conv(groups=16), "direct", {"order": "image"}, 80.0),
    ])])
