#!/usr/bin/env python3
"""Every candidate of our attention variants (default: wgmma, ring depth 2) on five shapes,
each checked against cuDNN SDPA's output on the same tensors, then timed (CUDA events, L2
flush, median) beside cuDNN: what the tuner sees, one line per candidate.

    PYTHONPATH=. python3 benchmarks/attention_candidates.py [--default] [--decode] [variant ...]

``--default``: only each variant's default parameters (what an unplanned call runs).
``--decode``: decode shapes (one query token over a long KV cache, several models' head
layouts) instead, reported in GB/s of the minimum bytes and as a share of the copy bandwidth
measured in the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

SHAPES: list[dict[str, Any]] = [
    dict(batch=4, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16"),
    dict(batch=4, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16", causal="top_left"),
    dict(batch=4, heads_q=32, seq_q=2048, head_dim=64, dtype="float16"),
    dict(batch=4, heads_q=16, seq_q=4096, head_dim=256, dtype="bfloat16"),
    dict(batch=2, heads_q=32, heads_kv=8, seq_q=1000, head_dim=128, dtype="bfloat16",
         layout="BSHD"),
]

DECODE_SHAPES: list[dict[str, Any]] = [
    # LLaMA-2/3 8B-class GQA 32/8, the benchmark's two decode rows
    dict(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128, dtype="bfloat16"),
    dict(batch=32, heads_q=32, heads_kv=8, seq_q=1, seq_kv=8192, head_dim=128,
         dtype="bfloat16"),
    # one long-context user (Mistral 7B: 32/8 over 32k), LLaMA-70B-class 64/8
    dict(batch=1, heads_q=32, heads_kv=8, seq_q=1, seq_kv=32768, head_dim=128,
         dtype="bfloat16"),
    dict(batch=8, heads_q=64, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128,
         dtype="bfloat16"),
    # many short caches; GPT-2-style MHA at head dim 64 in fp16
    dict(batch=64, heads_q=32, heads_kv=8, seq_q=1, seq_kv=1024, head_dim=128,
         dtype="bfloat16"),
    dict(batch=16, heads_q=12, heads_kv=12, seq_q=1, seq_kv=2048, head_dim=64,
         dtype="float16"),
]


def _shape(op: Any, p: Any, torch: Any) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(0)
    tdt = getattr(torch, p["dtype"])
    specs = op.input_specs(p)
    q, k, v = (torch.randn(specs[n].shape, device="cuda", generator=g).to(tdt)
               for n in ("q", "k", "v"))
    bshd = p["layout"] == "BSHD"
    tq, tk, tv = (x.transpose(1, 2) if bshd else x for x in (q, k, v))
    causal, gqa = p["causal"] != "none", p["heads_kv"] != p["heads_q"]

    def cudnn() -> Any:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                  enable_gqa=gqa)

    ref = cudnn().transpose(1, 2) if bshd else cudnn()
    t_ref = common.time_us(cudnn, budget_ms=60)["median_us"]
    flop = op.flops(p)
    print(f"{p.short()}: cuDNN {t_ref:.0f} us {flop / t_ref / 1e6:.0f} TFLOP/s "
          f"{op.min_bytes(p) / t_ref / 1e3:.0f} GB/s", flush=True)
    outs = {n: torch.empty(s.shape, device="cuda", dtype=getattr(torch, s.dtype))
            for n, s in op.output_specs(p).items()}
    return q, k, v, ref, outs, t_ref, flop


def main() -> int:
    import torch

    from dnnctl.backends.registry import get_backend
    from dnnctl.ops.registry import get_op, get_variant

    op = get_op("attention")
    dev = get_backend("cupy").device(0)
    only_default = "--default" in sys.argv
    decode = "--decode" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or ["wgmma"]
    copy = common.copy_gbps() if decode else 0.0
    if decode:
        print(f"copy bandwidth (1 GiB each way): {copy:.0f} GB/s", flush=True)
    for key in DECODE_SHAPES if decode else SHAPES:
        p = op.problem(key)
        q, k, v, ref, outs, t_ref, flop = _shape(op, p, torch)
        ins = {"q": q, "k": k, "v": v}
        for name in names:
            var = get_variant("attention", "cupy", name)
            ok = var.supports(p, dev)
            if not ok:
                print(f"   {name} unsupported: {ok.reason}")
                continue
            space = ([var.default_params(p, dev)] if only_default
                     else [c for c in var.param_space(p, dev) if c.get("stages", 2) == 2])
            for params in space:
                try:
                    kern = var.build(p, params, dev)
                    outs["out"].fill_(float("nan"))
                    kern(ins, outs, {})
                    torch.cuda.synchronize()
                    y = outs["out"].float()
                    err = float((y - ref.float()).norm() / ref.float().norm())
                    t = common.time_us(lambda kern=kern, ins=ins, outs=outs: kern(ins, outs, {}), warmup_ms=5,
                                       budget_ms=30)["median_us"]
                except Exception as exc:  # reported; the run goes on
                    print(f"   {name} {params}: FAILED {type(exc).__name__}: {exc}"[:240])
                    continue
                rate = (f"{op.min_bytes(p) / t / 1e3:.0f} GB/s "
                        f"{op.min_bytes(p) / t / 1e1 / copy:.1f} % of copy" if decode
                        else f"{flop / t / 1e6:.0f} TFLOP/s")
                print(f"   {name} {params}: err {err:.2e} {t:.1f} us {rate} "
                      f"({t_ref / t:.2f}x cuDNN)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
