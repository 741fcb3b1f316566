#!/usr/bin/env python3
"""Where batch_norm training time goes: each CUDA kernel's time (torch profiler) of dnnctl's
training forward and backward and of torch's, on ResNet-50's 64 x 56 x 56 x 256 fp16 NHWC
(or --shape N C H W), unplanned (the default variants).

    PYTHONPATH=. python3 tools/bn_kernel_times.py [--shape 64 256 56 56]
"""

from __future__ import annotations

import sys
from collections import defaultdict


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    import dnnctl.ops as ops

    n, c, h, w = 64, 256, 56, 56
    if "--shape" in sys.argv:
        i = sys.argv.index("--shape")
        n, c, h, w = (int(v) for v in sys.argv[i + 1:i + 5])
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, w, c, device="cuda", generator=g).half()  # NHWC storage
    dy = torch.randn(n, h, w, c, device="cuda", generator=g).half()
    wt = torch.rand(c, device="cuda", generator=g) + 0.5
    b = torch.randn(c, device="cuda", generator=g)
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    xt = x.permute(0, 3, 1, 2)  # the same memory as torch's channels_last NCHW view
    dyt = dy.permute(0, 3, 1, 2)

    def ours() -> None:
        y, sm, si = ops.batch_norm(x, rm, rv, wt, b, training=True, layout="NHWC",
                                   return_stats=True)
        ops.batch_norm_backward(dy, x, sm, si, wt, layout="NHWC")

    def theirs() -> None:
        xl = xt.detach().requires_grad_(True)
        wl, bl = wt.detach().requires_grad_(True), b.detach().requires_grad_(True)
        y = F.batch_norm(xl, rm.clone(), rv.clone(), wl, bl, training=True)
        y.backward(dyt)

    bytes_x = x.numel() * x.element_size()
    for name, fn in (("dnnctl", ours), ("torch", theirs)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        times: dict[str, list[float]] = defaultdict(list)
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                times[ev.name[:90]].append(ev.device_time_total if hasattr(
                    ev, "device_time_total") else ev.cuda_time_total)
        print(f"{name}: x = {bytes_x / 1e6:.0f} MB per tensor")
        for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
            v = sorted(v)
            print(f"  {v[len(v) // 2]:8.1f} us median x{len(v):3d}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
