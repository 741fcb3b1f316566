#!/usr/bin/env python3
"""Verify CUDA variants on the CPU emulator: random parameter samples x edge-case problems.

    python tools/cuda_emu/check_kernels.py matmul --variants mma,mma_atomic,simt -n 3
    python tools/cuda_emu/check_kernels.py conv2d --variants implicit_gemm,gemm_1x1

Every candidate is built through the variant's own build() (the same launch code as on
the GPU) and checked with dnnctl.ops.check on fresh inputs with poisoned outputs.
Exit status 1 if any candidate fails.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.cuda_emu.emu import install  # noqa: E402

MATMUL = [
    dict(m=1, n=1, k=1, dtype="float16"),
    dict(m=70, n=96, k=104, dtype="float16"),
    dict(m=33, n=41, k=77, dtype="float16", trans_a=True, trans_b=True, activation="relu"),
    dict(m=33, n=40, k=50, dtype="bfloat16", bias=True, activation="gelu"),
    dict(batch=2, m=40, n=24, k=200, dtype="bfloat16", trans_b=True, bias=True),
    dict(m=130, n=136, k=72, dtype="bfloat16", trans_a=True, activation="silu"),
    dict(m=17, n=200, k=264, dtype="float16", bias=True),
    dict(m=5, n=66, k=30, dtype="float16", trans_a=True),
    dict(m=50, n=60, k=70, dtype="float32", tf32=True, bias=True),
    dict(m=50, n=60, k=72, dtype="float32", tf32=True, trans_a=True, trans_b=True),
    dict(m=50, n=61, k=70, dtype="float32", bias=True, activation="gelu"),
    dict(batch=3, m=17, n=9, k=33, dtype="float32", trans_a=True, trans_b=True),
    dict(m=9, n=40, k=300, dtype="float32", trans_b=True),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=["matmul", "conv2d"])
    ap.add_argument("--variants", default="")
    ap.add_argument("-n", type=int, default=2, help="parameter samples per problem x variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="index of one problem")
    args = ap.parse_args()
    be = install()
    from dnnctl.ops.check import check_variant
    from dnnctl.ops.registry import get_op, variants

    op = get_op(args.op)
    dev = be.device(0)
    wanted = [v for v in args.variants.split(",") if v]
    vs = [v for v in variants(args.op, "cupy") if (not wanted or v.name in wanted)
          and v.name != "cublas"]
    if args.op == "matmul":
        problems = MATMUL
    else:
        from tools.cuda_emu.conv_cases import CONV
        problems = CONV
    rng = random.Random(args.seed)
    failed = 0
    for i, key in enumerate(problems):
        if args.only is not None and i != args.only:
            continue
        p = op.problem(key)
        for v in vs:
            ok = v.supports(p, dev)
            if not ok:
                print(f"-- {v.name:14s} {p.short()}: unsupported ({ok.reason})")
                continue
            space = list(v.param_space(p, dev))
            own = getattr(v, "default_params", None)
            picks = [own(p, dev)] if own else []
            picks += rng.sample(space, min(args.n, len(space))) if space else []
            for params in [x for x in picks if x is not None]:
                t0 = time.time()
                try:
                    res = check_variant(op, p, v, params, be, dev, seed=rng.randrange(1 << 30))
                    status = "ok  " if res.ok else "FAIL"
                    detail = f"err {res.max_rel_err:.2e} {res.detail}"
                except Exception as exc:  # noqa: BLE001 - report and go on
                    status, detail = "ERR ", f"{type(exc).__name__}: {exc}"[:2000]
                failed += status != "ok  "
                print(f"{status} {v.name:14s} {p.short()} {params} {detail} "
                      f"[{time.time() - t0:.1f}s, space {len(space)}]", flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
