"""Pointwise fusion (dnnctl.torch.pointwise): a chain of elementwise ops as torch runs it
(one kernel an op) against the one generated kernel, at real models' sizes, on one GPU.

Chains (tests/unit/_pointwise_cases.py has the modules):

- rotary embedding of q and k (transformers' apply_rotary_pos_emb, LLaMA-7B: 32 heads of
  128, bf16): prefill at 2048 tokens (q and k transposed views of the projections, as
  ``.view(b, s, h, d).transpose(1, 2)`` makes them), and a decode step at batch 8;
- T5's RMSNorm tail (``x * rsqrt(var + eps)`` then ``w * x``), T5-large d=1024 at 4096 tokens,
  bf16;
- CLIP's QuickGELU on the ViT-L/14 MLP (257 tokens x batch 32 x 4096), fp16;
- SwiGLU's ``silu(gate) * up`` from one fused projection, LLaMA-7B hidden 11008 at 2048
  tokens, bf16;
- DINOv2's layer scale with a tanh GELU (ViT-g 1536 wide, 257 tokens x batch 32), fp16.

Per chain: GPU us of the eager ops and of the kernel (CUDA events, GPU kept busy so host time
is hidden), the kernel's GB/s (bytes it must move: each input read once, the output written
once) against a device-to-device copy of as many bytes measured in the same run, and host
wall us per call of each (what an eager loop pays). The kernel's output is checked against
the ops first (within a rounding of its dtype).

    PYTHONPATH=. python3 benchmarks/bench_pointwise.py [--out F.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

import _torch_bench as tb  # noqa: E402

TITLE = "Pointwise chains: torch's ops vs dnnctl's one generated kernel"


def _chains():
    import _pointwise_cases as pc
    import torch

    bf, h = torch.bfloat16, torch.float16
    return [
        ("rope prefill 2048, 32x128", pc.Rope(), [(1, 32, 2048, 128), (1, 32, 2048, 128),
                                                   (2048, 128), (2048, 128)], (0, 2, 1, 3), bf),
        ("rope decode b8, 32x128", pc.Rope(), [(8, 32, 1, 128), (8, 32, 1, 128), (1, 128),
                                               (1, 128)], (0, 2, 1, 3), bf),
        ("t5 norm tail 4096x1024", pc.T5Norm(1024), [(4, 1024, 1024)], None, bf),
        ("quick_gelu 8224x4096", pc.QuickGelu(), [(8224, 4096)], None, h),
        ("swiglu 2048x11008", pc.SwiGlu(), [(2048, 2 * 11008)], None, bf),
        ("layer_scale 8224x1536", pc.LayerScale(1536), [(8224, 1536), (8224, 1536)], None, h),
    ]


def _row(name, module, shapes, perm, dtype):
    import _pointwise_cases as pc
    import torch
    from torch import fx

    from dnnctl.torch import pointwise as pw

    module = module.to("cuda", dtype if isinstance(module, pc.LayerScale) else None)
    gm = fx.symbolic_trace(module)
    pw.fuse_pointwise(gm)
    args = pc.inputs(shapes, perm, dtype, "cuda")
    fused = [m for m in gm.modules() if isinstance(m, pw.FusedPointwise)]
    with torch.no_grad():
        for _ in range(3):
            got = gm(*args)
        want = module(*args)
        for w, g in zip(want if isinstance(want, tuple) else (want,),
                        got if isinstance(got, tuple) else (got,)):
            tol = 1e-5 if w.dtype == torch.float32 else 1e-2
            if not torch.allclose(g.float(), w.float(), rtol=tol, atol=tol):
                raise AssertionError("the kernel disagrees with the ops")
        if not all(m.kernel_launches >= 2 and not m.refused for m in fused):
            raise AssertionError(f"kernel not used: {[m.refused for m in fused]}")
        eager_gpu = tb.kernel_us(lambda: module(*args))
        fused_gpu = tb.kernel_us(lambda: gm(*args))
        eager_host = tb.wall_us(lambda: module(*args), n=300)
        fused_host = tb.wall_us(lambda: gm(*args), n=300)
    moved = 0
    for a in args:
        moved += a.numel() * a.element_size()
    outs = got if isinstance(got, tuple) else (got,)
    moved += sum(o.numel() * o.element_size() for o in outs)
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = tb.kernel_us(lambda: dst.copy_(src))  # reads and writes moved / 2: moved bytes
    return {"chain": name, "dtype": str(dtype).replace("torch.", ""), "groups": len(fused),
            "eager GPU us": round(eager_gpu, 1), "dnnctl GPU us": round(fused_gpu, 1),
            "x": round(eager_gpu / fused_gpu, 2),
            "GB/s": round(moved / fused_gpu / 1e3, 0),
            "% of copy": round(100 * copy_us / fused_gpu, 0),
            "eager host us": round(eager_host, 1), "dnnctl host us": round(fused_host, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    rows = [tb.safe_row({"chain": c[0]}, lambda c=c: _row(*c)) for c in _chains()]
    tb.finish(TITLE, rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
