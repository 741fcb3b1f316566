"""Helpers of the torch-facing benchmarks: host wall time, CUDA-event kernel time, an
in-memory plan of the default choices, soft-failing rows, and the JSON + markdown output."""

from __future__ import annotations

import datetime as _dt
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402


def wall_us(fn: Callable[[], Any], n: int = 2000, repeats: int = 7) -> float:
    """Host wall time per call: N back-to-back calls between two synchronizations, median
    over ``repeats`` (what a Python loop calling the op really pays)."""
    import torch

    for _ in range(max(10, n // 20)):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def kernel_us(fn: Callable[[], Any], samples: int = 50, sleep_cycles: int = 2_000_000
              ) -> float:
    """GPU time of one call from CUDA events, with the GPU kept busy (torch.cuda._sleep of
    ``sleep_cycles``, longer than the call's host time) so that host overhead is hidden:
    what the kernel(s) of the call cost on the device."""
    import torch

    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def events_ms(fn: Callable[[], Any], warmup: int = 5, iters: int = 20) -> float:
    """Median milliseconds per call of ``fn`` from CUDA events (one pair per call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gpu_backend() -> Any:
    """dnnctl's GPU backend object (whatever name it has in this dnnctl)."""
    try:  # the backend registry's home moved between dnnctl versions
        from dnnctl.backends.registry import get_backend
    except ImportError:
        from dnnctl.backends.registry import get_backend  # type: ignore[no-redef]

    last: Exception | None = None
    for name in ("cuda", "cupy"):
        try:
            be = get_backend(name)
        except Exception as exc:  # not a backend name in this version
            last = exc
            continue
        return be
    raise RuntimeError(f"no dnnctl GPU backend: {last}")


def default_plan(problems: Iterable[Any]) -> Any:
    """A loaded plan whose entries are each problem's default choice on this GPU: a planned
    call (a plan hit) that runs the same kernel as the unplanned one."""
    from dnnctl.ops.registry import get_op

    be = gpu_backend()
    dev = be.device(0)
    return plan_with([(p, get_op(p.op).default_choice(p, be.name, dev)) for p in problems])


def plan_with(choices: Iterable[tuple[Any, Any]]) -> Any:
    """A loaded plan for this GPU with the given (problem, Choice) entries: what a tuned
    plan that picked them dispatches."""
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest

    dev = gpu_backend().device(0)
    entries = [PlanEntry(p, c) for p, c in choices]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return LoadedPlan(Plan([Section(dev.fingerprint(), kernels_digest(), now, {}, entries)]))


def safe_row(label: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``{**label, **fn()}``, or the label with the error: one bad row never ends a table."""
    try:
        return {**label, **fn()}
    except Exception as exc:  # fail soft per row; the error goes into the table
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return {**label, "error": f"{type(exc).__name__}: {str(exc)[:140]} "
                                  f"({Path(tb.filename).name}:{tb.lineno})"}


def environment() -> dict[str, Any]:
    import torch

    meta: dict[str, Any] = {"date": _dt.date.today().isoformat(), "torch": torch.__version__}
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
        meta["cuda"] = torch.version.cuda
    try:
        import cupy

        meta["cupy"] = cupy.__version__
    except ImportError:
        meta["cupy"] = None
    return meta


def finish(title: str, rows: list[dict[str, Any]], out: str | None,
           extra: dict[str, Any] | None = None) -> None:
    """Write ``{"meta", "rows"}`` JSON to ``out`` and print the markdown table (last)."""
    meta = {**environment(), **(extra or {})}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"title": title, "meta": meta, "rows": rows},
                                        indent=1, default=str))
    print(f"\n## {title}\n")
    print(", ".join(f"{k} {v}" for k, v in meta.items() if v is not None) + "\n")
    print(common.markdown(rows))
