"""Dispatcher cost of torch's custom-op registration paths, on CPU tensors (no GPU needed).

Each path wraps the same trivial kernel (``x.new_empty(x.shape)``, so the number is the
registration's overhead, not the op's): a plain Python call; ``Library.define`` + ``impl``
(what dnnctl.torch uses), without and with ``register_autograd``; ``@custom_op`` without
and with ``register_autograd``. Median per call over many back-to-back calls, under
``torch.no_grad()`` and with autograd on (inputs not requiring grad), plus the real
``torch.ops.dnnctl.relu`` and a patched module's direct path for scale.

    PYTHONPATH=. python3 benchmarks/bench_torch_dispatch.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import torch  # noqa: E402

LIB = torch.library.Library("dnnctl_bench", "DEF")


def _kernel(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _backward(ctx, grad):
    return grad


def _setup(ctx, inputs, output):
    pass


def _register() -> dict[str, object]:
    for name, autograd in (("lib_plain", False), ("lib_autograd", True)):
        LIB.define(f"{name}(Tensor x) -> Tensor")
        LIB.impl(name, _kernel, "CPU")
        LIB.impl(name, _kernel, "CUDA")
        torch.library.register_fake(f"dnnctl_bench::{name}", _kernel, lib=LIB)
        if autograd:
            torch.library.register_autograd(f"dnnctl_bench::{name}", _backward,
                                            setup_context=_setup, lib=LIB)

    @torch.library.custom_op("dnnctl_bench::co_plain", mutates_args=())
    def co_plain(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape)

    @torch.library.custom_op("dnnctl_bench::co_autograd", mutates_args=())
    def co_autograd(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape)

    co_autograd.register_autograd(_backward, setup_context=_setup)
    ops = torch.ops.dnnctl_bench
    return {"python call": _kernel, "Library.define+impl": ops.lib_plain,
            "Library.define+impl + register_autograd": ops.lib_autograd,
            "@custom_op": co_plain, "@custom_op + register_autograd": co_autograd}


def per_call_us(fn, x, n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean per-call time of ``n`` back-to-back calls."""
    for _ in range(n // 10 + 1):
        fn(x)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def run(quick: bool) -> list[dict]:
    paths = _register()
    import dnnctl.torch  # noqa: F401  (registers torch.ops.dnnctl)
    from dnnctl.torch.modules import run_op

    x = torch.randn(64, 128)
    paths["torch.ops.dnnctl.relu (numpy kernel)"] = torch.ops.dnnctl.relu
    paths["patched module path (no grad: direct)"] = lambda t: run_op("relu", t, 0)
    paths["torch.relu (reference)"] = torch.relu
    n, repeats = (2000, 5) if quick else (20000, 15)
    rows = []
    for name, fn in paths.items():
        row = {"path": name}
        try:
            with torch.no_grad():
                row["no_grad us"] = per_call_us(fn, x, n, repeats)
            row["grad on us"] = per_call_us(fn, x, n, repeats)
        except Exception as exc:  # one failing path must not end the table
            row["error"] = f"{type(exc).__name__}: {exc}"[:120]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    rows = run(args.quick)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"torch {meta['torch']}, CPU tensors 64x128 float32, median per call")
    print(common.markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
