#!/usr/bin/env python3
"""Sweep of batch_norm's training forward (train_lastblock) and backward (bwd_reduce_dx)
parameters on ResNet-50 batch-64 fp16 NHWC shapes, torch in the same run: each candidate is
checked against torch first, then timed (CUDA events, L2 flushed, medians); prints the six
fastest per shape and the best time per value of each parameter.

    PYTHONPATH=. python3 tools/bn_param_sweep.py            # four shapes
    BN_SHAPES=2 PYTHONPATH=. python3 tools/bn_param_sweep.py  # the first two
"""
import itertools
import sys
import time

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import common
import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from bench_backward import BW, _bn_bwd, _bn_train_fwd
from bench_memory import _nchw, _rel_err, warm_kernel_cache

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import np_dtype
from dnnctl.ops.registry import get_op, get_variant


def main():
    be = get_backend("cupy")
    dev = be.device(0)
    op = get_op("batch_norm")
    import os
    SHAPES = [(256, 56, 56), (1024, 14, 14), (64, 112, 112), (512, 28, 28)][:int(os.environ.get("BN_SHAPES", "4"))]
    fwd_v = get_variant("batch_norm", "cupy", "train_lastblock")
    bwd_v = get_variant("batch_norm", "cupy", "bwd_reduce_dx")
    plan = []
    for c, h, w in SHAPES:
        dims = dict(n=64, c=c, h=h, w=w, training=True, dtype="float16", layout="NHWC")
        pf, pb = op.problem(dims), op.problem(dict(dims, **BW))
        fc = [(fwd_v, dict(block=b, vec=8, unroll=u, blocks_per_sm=s, tile=t))
              for b, u, s, t in itertools.product((256, 512), (2, 4, 8), (2, 4), (128, 512))
              if b * s <= 2048]
        bc = [(bwd_v, dict(block=b, vec=8, waves=wv, tile=t, unroll=u, rev=r))
              for b, wv, t, u, r in itertools.product((256, 512), (2, 4), (128, 512), (1, 2, 4), (0, 1))]
        plan.append((("fwd", c, h, w, _bn_train_fwd), pf, fc))
        plan.append((("bwd", c, h, w, _bn_bwd), pb, bc))
    t0 = time.time()
    print(f"compile {warm_kernel_cache(plan, dev):.0f} s", flush=True)
    rng = np.random.default_rng(0)
    for (kind, c, h, w, setup), problem, cands in plan:
        ins = {k: be.asarray(v) for k, v in op.make_inputs(problem, rng).items()}
        outs = {k: cp.empty(s.shape, dtype=np_dtype(s.dtype)) for k, s in op.output_specs(problem).items()}
        attrs = op.default_attrs(problem)
        tt = {k: torch.from_dlpack(v) for k, v in ins.items()}
        go, want = setup(F, torch, tt, ins)
        t_torch = common.time_us(go, warmup_ms=10, budget_ms=60)["median_us"]
        res = []
        for v, p in cands:
            try:
                kern = v.build(problem, p, dev)
                kern(ins, outs, attrs)
                cp.cuda.get_current_stream().synchronize()
                for name, ref in want.items():
                    got = torch.from_dlpack(outs[name])
                    if name == "y":
                        got = _nchw(got)
                    err = _rel_err(got.reshape(ref.shape), ref)
                    assert err <= 3 * op.tolerance(problem, name) + 1e-3, (name, err)
                t = common.time_us(lambda k=kern, i=ins, o=outs, a=attrs: k(i, o, a),
                                   warmup_ms=3, budget_ms=12)["median_us"]
                res.append((t, p))
            except Exception as exc:
                print(f"  {kind} {p}: {type(exc).__name__} {str(exc)[:100]}")
        res.sort(key=lambda r: r[0])
        print(f"== {kind} 64x{h}x{w}x{c}: torch {t_torch:.1f} us; best {res[0][0]:.1f} ({t_torch/res[0][0]:.3f}x)")
        for t, p in res[:6]:
            print(f"    {t:7.1f}  {p}")
        # marginal effect of each new parameter: best time per value
        for key in (("tile", "unroll", "rev") if kind == "bwd" else ("tile", "unroll")):
            best = {}
            for t, p in res:
                best.setdefault(p[key], t)
            print(f"    best by {key}: " + ", ".join(f"{k}={v:.1f}" for k, v in sorted(best.items())))
        del ins, outs, tt
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    print(f"total {time.time()-t0:.0f} s")

if __name__ == '__main__':
    main()
