"""Shared benchmark harness: ceilings measured in the same run, one timer for everyone.

Every section module (bench_*.py) exposes ``TITLE`` and ``run(ctx, quick) -> list[dict]``;
each row is a dict of columns. ``run.py`` prints the header (date, GPU, driver, ceilings)
and every section as a markdown table ready for RESULTS.md.

Timing follows METHOD.md: CUDA events around each sample, time-based warm-up, L2 flushed
between samples, median over many samples (dnnctl's own CupyBackend.time, so the tuner and
the benchmarks measure the same way). torch runs on the same (legacy default) stream.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Ctx:
    gpu: str
    driver: str
    cuda: str
    torch: str
    cudnn: str
    copy_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    bf16_tflops: float  # torch bf16 8192^3 matmul on random data
    fp16_tflops: float
    notes: list[str] = field(default_factory=list)

    def header(self) -> str:
        today = _dt.date.today().isoformat()
        return (f"Run {today} on {self.gpu}, driver {self.driver}, CUDA {self.cuda}, "
                f"torch {self.torch}, cuDNN {self.cudnn}.\n"
                f"Ceilings measured in this run: copy {self.copy_gbps:.0f} GB/s; "
                f"bf16 GEMM {self.bf16_tflops:.0f} TFLOP/s; fp16 GEMM {self.fp16_tflops:.0f} TFLOP/s.")


def backend():
    from dnnctl.backends.registry import get_backend

    return get_backend("cupy")


def time_us(fn, *, warmup_ms: float = 20.0, budget_ms: float = 60.0,
            flush_l2: bool = True, host_ahead: bool = False) -> dict[str, float]:
    """Median / p20 / p80 in microseconds of ``fn`` (CUDA events, L2 flush). A sample is
    what an eager caller waits for, host time included where it outlasts the GPU work;
    ``host_ahead``: the GPU's work alone (the host enqueues the call ahead of it)."""
    s = sorted(backend().time(fn, warmup_ms=warmup_ms, budget_ms=budget_ms,
                              flush_l2=flush_l2, host_ahead=host_ahead).tolist())
    q = statistics.quantiles(s, n=10) if len(s) >= 10 else [s[0]] * 9
    return {"median_us": statistics.median(s), "p20_us": q[1], "p80_us": q[7], "n": len(s)}


def copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read + written, 1 GiB each way (torch)."""
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_us(lambda s=src, d=dst: d.copy_(s), flush_l2=False, budget_ms=100)["median_us"]
    return 2 * n / (t * 1e-6) / 1e9


def measure_ceilings() -> Ctx:
    import torch

    dev = torch.device("cuda")
    copy = copy_gbps()
    flops = {}
    for dt in (torch.bfloat16, torch.float16):
        a = torch.randn(8192, 8192, device=dev, dtype=dt)
        b = torch.randn(8192, 8192, device=dev, dtype=dt)
        t = time_us(lambda a=a, b=b: torch.matmul(a, b), flush_l2=False, budget_ms=200)
        flops[dt] = 2 * 8192**3 / (t["median_us"] * 1e-6) / 1e12
    from dnnctl.backends.cupy_backend import CupyBackend

    info = CupyBackend().device(0)
    return Ctx(gpu=info.name, driver=info.driver, cuda=info.cuda_runtime,
               torch=torch.__version__, cudnn=str(torch.backends.cudnn.version()),
               copy_gbps=copy, bf16_tflops=flops[torch.bfloat16],
               fp16_tflops=flops[torch.float16])


def markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    cols: list[str] = []
    for r in rows:  # list / dict values (per-candidate detail) stay in the JSON only
        cols += [c for c, v in r.items() if c not in cols and not isinstance(v, (list, dict))]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out) + "\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0 or abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def geomean(values: list[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return 0.0
    import math

    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def precompile(record_jobs: Any, args: tuple, budget_s: float,
               record_timeout_s: float = 120.0) -> str:
    """Compile every kernel module a benchmark will build into CuPy's disk cache, with a
    process pool: ``record_jobs(*args)`` (a module-level function) lists the jobs in a spawned
    process (so this one's CUDA context stays clean), then the pool compiles them within what
    is left of ``budget_s``. Returns one line saying what happened; never raises."""
    import concurrent.futures as cf
    import multiprocessing
    import time

    from dnnctl.ops.precompile import compile_jobs, default_workers

    t0 = time.time()
    one = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        jobs = one.submit(record_jobs, *args).result(timeout=record_timeout_s)
    except Exception as exc:
        return f"kernel pre-compilation skipped ({type(exc).__name__}: {exc})"
    finally:
        one.shutdown(wait=False, cancel_futures=True)
    workers = default_workers()
    try:
        done, failed = compile_jobs(jobs, workers=workers,
                                    timeout_s=max(1.0, budget_s - (time.time() - t0)))
    except Exception as exc:
        return f"kernel pre-compilation stopped ({type(exc).__name__}: {exc})"
    return (f"pre-compiled {done}/{len(jobs)} kernel modules with {workers} processes in "
            f"{time.time() - t0:.0f} s ({len(failed)} failed to compile)")


def candidate_call(stack: Any, variant: Any, kern: Any, inputs: dict[str, Any],
                   outs: dict[str, Any], attrs: dict[str, Any] | None = None
                   ) -> tuple[Any, dict[str, Any]]:
    """(a timed call, its first results) of a built candidate, run as the tuner runs it: a
    library called through torch on torch views made once, inside ``stack``
    (dnnctl.ops.torch_vendor.native_io: what a patched model's call costs), and a kernel
    that adopts its outputs called without them. ``attrs``: the op's (eps, momentum...)."""
    from dnnctl.ops.dispatch import adopting
    from dnnctl.ops.torch_vendor import native_io

    attrs = {} if attrs is None else attrs
    args, to_backend = stack.enter_context(native_io(variant, inputs))
    given = {} if adopting(kern) else outs
    made = kern(args, given, attrs)
    got = to_backend(made) if given is not outs else outs

    def run() -> None:
        kern(args, given, attrs)

    return run, got
