#!/usr/bin/env python3
"""Compile every distinct kernel configuration the tensor-core variants can ask for on a set
of representative problems, with NVRTC exactly as the cupy backend does (no GPU needed).

    python tools/cuda_emu/compile_sweep.py [--jobs 2] [--limit N]

Catches static_assert / template errors that only some points of a parameter space hit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def collect() -> set[tuple[str, tuple]]:
    from tools.cuda_emu.emu import EmuBackend, install

    seen: set[tuple[str, tuple]] = set()

    class Recorder(EmuBackend):
        def compile_module(self, source, *, defines=None, name_expressions=(), options=(),
                           device=None):
            seen.add((source, tuple(sorted((defines or {}).items()))))

            class _Mod:
                def get_function(self, name):
                    class _F:
                        max_dynamic_shared_size_bytes = 0
                    return _F()
            return _Mod()

    from dnnctl.backends import registry as base
    install()
    be = Recorder()
    base._BACKENDS["cupy"] = be
    from dnnctl.ops.registry import get_op, get_variant

    dev = be.device(0)
    mm = get_op("matmul")
    for key in (dict(m=4096, n=4096, k=4096), dict(m=16, n=4096, k=4096),
                dict(m=16, n=4096, k=4096, trans_b=True),
                dict(m=37, n=77, k=300, trans_a=True, trans_b=True)):
        for dtype in ("float16", "bfloat16", "float32"):
            for tf32 in (False, True):
                p = mm.problem(dict(key, dtype=dtype, tf32=tf32, bias=True))
                for name in ("mma", "mma_atomic", "simt", "wgmma"):
                    v = get_variant("matmul", "cupy", name)
                    if v.supports(p, dev):
                        for params in v.param_space(p, dev):
                            v.build(p, params, dev)
    conv = get_op("conv2d")
    for key in (dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
                dict(n=1, c=512, h=7, w=7, k=512, r=3, s=3, pad=1),
                dict(n=8, c=256, h=14, w=14, k=512, r=1, s=1, stride=2),
                dict(n=8, c=256, h=14, w=14, k=512, r=1, s=1),
                dict(n=8, c=3, h=64, w=64, k=64, r=7, s=7, stride=2, pad=3)):
        for dtype in ("float16", "float32"):
            for layout in ("NHWC", "NCHW"):
                p = conv.problem(dict(key, dtype=dtype, layout=layout, residual=True))
                for name in ("implicit_gemm", "gemm_1x1", "implicit_gemm_wgmma"):
                    v = get_variant("conv2d", "cupy", name)
                    if v.supports(p, dev):
                        for params in v.param_space(p, dev):
                            v.build(p, params, dev)
    return seen


def compile_one(item: tuple[str, tuple]) -> tuple[bool, str]:
    source, defines = item
    cmd = [sys.executable, str(ROOT / "tools" / "nvrtc_check.py"), str(ROOT / "kernels" / source)]
    for k, v in defines:
        cmd += ["-D", f"{k}={v}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    ok = res.returncode == 0 and "error" not in res.stdout
    return ok, f"{source} {dict(defines)}\n{res.stdout[-1500:]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    # static checks depend on tiles, warps, math, layouts and vector widths; the pipeline
    # depth and the epilogue flags do not change what compiles: one representative each
    skip = ("EPI_ACT", "EPI_BIAS", "EPI_RES", "EPI_OUT", "EPI_PAIR", "GEMM_STAGES")
    reps: dict[tuple, tuple[str, tuple]] = {}
    for source, defines in sorted(collect()):
        key = (source, tuple(kv for kv in defines if kv[0] not in skip))
        reps.setdefault(key, (source, defines))
    items = sorted(reps.values())
    if args.limit:
        items = items[::max(1, len(items) // args.limit)]
    print(f"{len(items)} configurations", flush=True)
    bad = 0
    with ThreadPoolExecutor(args.jobs) as ex:
        for ok, text in ex.map(compile_one, items):
            if not ok:
                bad += 1
                print("FAIL", text, flush=True)
    print(f"{bad} failed of {len(items)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
