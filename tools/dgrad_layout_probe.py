#!/usr/bin/env python3
# ruff: noqa: B023  (each lambda is timed inside its loop iteration)
"""The data gradients of ResNet-50 v1.5 at batch 64 (fp16, channels_last; the 22 distinct
layers that take one, with their counts in the model), four ways, GPU time per call (CUDA
events with the host enqueued ahead, L2 flushed, medians):

- autograd: ``aten::convolution_backward`` as torch's autograd calls it (the real
  channels_last x, mask dx only);
- ``torch.nn.grad.conv2d_input``: the same op with a stride-0 stand-in for x;
- ``dgrad_torch_cudnn``: dnnctl's cuDNN candidate, called with torch tensors;
- dnnctl's own kernels: the variant and parameters ``conv2d.op.own_choice`` picks.

The last line sums each way over the model's layers (each layer times its count).

    PYTHONPATH=. python3 tools/dgrad_layout_probe.py [--batch 64]
"""
import argparse

import cupy as cp
import torch

from dnnctl.backends.registry import get_backend
from dnnctl.ops.conv2d.op import own_choice
from dnnctl.ops.registry import get_op, get_variant
from dnnctl.ops.torch_vendor import current_stream

# c, h, k, r, stride, layers of ResNet-50 v1.5 with this shape (the stem takes no dgrad)
LAYERS = (
    (64, 56, 64, 1, 1, 1), (64, 56, 64, 3, 1, 3), (64, 56, 256, 1, 1, 4),
    (256, 56, 64, 1, 1, 2), (256, 56, 128, 1, 1, 1), (128, 56, 128, 3, 2, 1),
    (128, 28, 512, 1, 1, 4), (256, 56, 512, 1, 2, 1), (512, 28, 128, 1, 1, 3),
    (128, 28, 128, 3, 1, 3), (512, 28, 256, 1, 1, 1), (256, 28, 256, 3, 2, 1),
    (256, 14, 1024, 1, 1, 6), (512, 28, 1024, 1, 2, 1), (1024, 14, 256, 1, 1, 5),
    (256, 14, 256, 3, 1, 5), (1024, 14, 512, 1, 1, 1), (512, 14, 512, 3, 2, 1),
    (512, 7, 2048, 1, 1, 3), (1024, 14, 2048, 1, 2, 1), (2048, 7, 512, 1, 1, 2),
    (512, 7, 512, 3, 1, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    n = ap.parse_args().batch
    be = get_backend("cupy")
    dev = be.device(0)
    op = get_op("conv2d")
    torch.backends.cudnn.benchmark = True
    cl = torch.channels_last
    backward = torch.ops.aten.convolution_backward.default

    def median_us(fn) -> float:
        s = sorted(be.time(fn, warmup_ms=5, budget_ms=25, host_ahead=True).tolist())
        return s[len(s) // 2]

    total = [0.0] * 4
    print("| c->k rxr/stride @h | layers | autograd | conv2d_input | dgrad_torch_cudnn "
          "| own (variant) |")
    print("|---|---:|---:|---:|---:|---|")
    for c, h, k, r, st, count in LAYERS:
        pad = r // 2
        key = dict(n=n, c=c, h=h, w=h, k=k, r=r, s=r, stride=[st, st], pad=[pad, pad],
                   dtype="float16", layout="NHWC", **{"pass": "dgrad"})
        problem = op.problem(key)
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
        p = (h + 2 * pad - r) // st + 1
        dy = torch.randn(n, k, p, p, device="cuda", dtype=torch.half).contiguous(
            memory_format=cl)
        autograd = median_us(lambda: backward(dy, x, w, None, [st, st], [pad, pad], [1, 1],
                                              False, [0, 0], 1, [True, False, False]))
        stand_in = median_us(lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, st, pad))
        ins = {"dy": cp.from_dlpack(dy.permute(0, 2, 3, 1)),
               "w": cp.from_dlpack(w.permute(0, 2, 3, 1))}
        tins = {name: torch.from_dlpack(v) for name, v in ins.items()}
        vendor = get_variant("conv2d", "cupy", "dgrad_torch_cudnn").build(problem, {}, dev)
        with current_stream():
            via_torch = median_us(lambda: vendor(tins, {}, {}))
        choice = own_choice(problem, "cupy", dev)
        own = get_variant("conv2d", "cupy", choice.variant).build(problem, dict(choice.params),
                                                                  dev)
        outs = {name: cp.empty(spec.shape, dtype=cp.float16)
                for name, spec in op.output_specs(problem).items()}
        mine = median_us(lambda: own(ins, outs, {}))
        for i, t in enumerate((autograd, stand_in, via_torch, mine)):
            total[i] += t * count
        print(f"| {c}->{k} {r}x{r}/{st} @{h} | {count} | {autograd:.1f} | {stand_in:.1f} | "
              f"{via_torch:.1f} | {mine:.1f} {choice.variant} |", flush=True)
    print("model total (us): " + " / ".join(f"{t:.0f}" for t in total))


if __name__ == "__main__":
    main()
