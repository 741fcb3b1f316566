"""Host cost of dnnctl.torch's own Python layers, from a patched module down to the
``dnnctl.ops`` call (not included): what every patched call pays on top of the pipeline.

The ``dnnctl.ops`` function each layer would call is replaced by a stub that returns a
ready tensor, so the numbers are the torch-side layers alone (module call, ``run_op``,
``dnnctl.torch.kernels``, a FusedConv's fold check and geometry), on any machine: the same
Python runs for CPU and CUDA tensors. Median of repeats, us per call.

    PYTHONPATH=. python3 benchmarks/bench_torch_layers.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_launch import per_call_us  # noqa: E402


def rows(calls: int) -> list[dict[str, Any]]:
    import torch
    from torch import nn

    import dnnctl.torch as dt
    from dnnctl.torch import kernels

    cl = torch.channels_last
    out4 = torch.empty(2, 8, 8, 16).permute(0, 3, 1, 2)  # a channels-last (N, C, H, W) view
    out2 = torch.empty(12, 32)
    real_call = kernels.call

    def stub(fn: Any, tensors: Any, **kw: Any) -> Any:  # noqa: ARG001
        x = tensors[0]
        return out4.permute(0, 2, 3, 1) if x.dim() == 4 else out2

    conv = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                         nn.ReLU()).eval().to(memory_format=cl)
    x4 = torch.randn(2, 16, 8, 8).contiguous(memory_format=cl)
    lin = nn.Sequential(nn.Linear(32, 32), nn.GELU()).eval()
    ln = nn.LayerNorm(32).eval()
    rms = nn.RMSNorm(32).eval() if hasattr(nn, "RMSNorm") else None
    x2 = torch.randn(3, 4, 32)
    found: list[dict[str, Any]] = []
    with torch.inference_mode():
        dt.patch(conv)
        dt.patch(lin)
        holder = nn.Sequential(ln, *([rms] if rms is not None else []))
        dt.patch(holder, trace=False)
        gm_conv = conv.__dict__["forward"].gm
        fused_conv = next(m for m in gm_conv.modules() if type(m).__name__ == "FusedConv")
        gm_lin = lin.__dict__["forward"].gm
        fused_lin = next(m for m in gm_lin.modules() if type(m).__name__ == "FusedLinear")
        cases = [("FusedConv conv+bn+relu, channels-last", lambda: fused_conv(x4)),
                 ("FusedLinear linear+gelu", lambda: fused_lin(x2)),
                 ("patched LayerNorm module", lambda: ln(x2))]
        if rms is not None:
            cases.append(("patched RMSNorm module", lambda: rms(x2)))
        kernels.call = stub
        try:
            for label, fn in cases:
                found.append({"layer": label, "us": per_call_us(fn, lambda: None, calls, 9)})
        finally:
            kernels.call = real_call
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    found = rows(args.calls)
    if args.json:
        print(json.dumps(found))
        return 0
    print("| torch-side layers (dnnctl.ops stubbed) | us / call |\n|---|---:|")
    for r in found:
        print(f"| {r['layer']} | {r['us']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
