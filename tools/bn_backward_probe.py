#!/usr/bin/env python3
# ruff: noqa: B023  (each lambda is timed inside its loop iteration)
"""cuDNN's batch-norm backward called through torch, on ResNet-50's BN shapes at batch 64
(fp16, channels_last): can ``aten::cudnn_batch_norm_backward`` run with an empty reserve
(its training forward reserves none without a fused activation), does it match torch's
``native_batch_norm_backward``, and how long does each take (CUDA events, medians), beside
the ReLU's ``threshold_backward`` that torch runs before it.

    PYTHONPATH=. python3 tools/bn_backward_probe.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _torch_bench as tb  # noqa: E402

SHAPES = ((64, 112), (64, 56), (256, 56), (128, 28), (512, 28), (256, 14), (1024, 14),
          (512, 7), (2048, 7))


def median_us(fn) -> float:
    return tb.events_ms(fn, warmup=5, iters=50) * 1000


def main() -> None:
    aten = torch.ops.aten
    for c, h in SHAPES:
        x = torch.randn(64, c, h, h, device="cuda", dtype=torch.half).contiguous(
            memory_format=torch.channels_last)
        dy = torch.randn_like(x)
        weight, bias = torch.ones(c, device="cuda"), torch.zeros(c, device="cuda")
        rmean, rvar = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        y, smean, sinv, reserve = aten.cudnn_batch_norm(x, weight, bias, rmean, rvar, True, 0.1,
                                                       1e-5)
        empty = torch.empty(0, dtype=torch.uint8, device="cuda")
        ref = aten.native_batch_norm_backward(dy, x, weight, rmean, rvar, smean, sinv, True,
                                              1e-5, [True, True, True])
        got = aten.cudnn_batch_norm_backward(x, dy, weight, rmean, rvar, smean, sinv, 1e-5,
                                             empty)
        err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                  for g, r in zip(got, ref))
        cudnn = median_us(lambda: aten.cudnn_batch_norm_backward(
            x, dy, weight, rmean, rvar, smean, sinv, 1e-5, empty))
        native = median_us(lambda: aten.native_batch_norm_backward(
            dy, x, weight, rmean, rvar, smean, sinv, True, 1e-5, [True, True, True]))
        relu = median_us(lambda: aten.threshold_backward(dy, y, 0))
        print(f"64x{h}x{h}x{c}: reserve {reserve.numel()} B, empty-reserve error {err:.1e}; "
              f"cudnn {cudnn:.1f} us, native {native:.1f} us, threshold_backward {relu:.1f} us",
              flush=True)


if __name__ == "__main__":
    main()
