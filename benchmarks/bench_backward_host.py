"""Host wall time per call of dnnctl's public backward functions from torch CUDA tensors,
against the aten backward op torch's autograd runs for the same gradient (tiny shapes, so
the host's cost is what is timed): _torch_bench.wall_us, median of 7 rounds of 400 calls,
synchronized at the end of each round.

    PYTHONPATH=. python3 benchmarks/bench_backward_host.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _torch_bench  # noqa: E402
import common  # noqa: E402


def cases(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    import dnnctl.ops as ops

    aten = torch.ops.aten
    dev, f16 = "cuda", torch.float16
    out = []
    # layer_norm 64 x 768
    x = torch.randn(64, 768, device=dev, dtype=f16)
    dy, w = torch.randn_like(x), torch.randn(768, device=dev, dtype=f16)
    b = torch.zeros_like(w)
    _, mean, rstd = aten.native_layer_norm(x, [768], w, b, 1e-5)
    mean32, rstd32 = mean.reshape(64), rstd.reshape(64)
    out.append(("layer_norm_backward 64x768",
                lambda: ops.layer_norm_backward(dy, x, w, mean32, rstd32),
                lambda: aten.native_layer_norm_backward(dy, x, [768], mean, rstd, w, b,
                                                        [True, True, True])))
    # batch_norm 8 x 64 x 28 x 28 (training statistics)
    xb = torch.randn(8, 64, 28, 28, device=dev, dtype=f16)
    dyb, wb = torch.randn_like(xb), torch.randn(64, device=dev, dtype=torch.float32)
    sm = xb.float().mean((0, 2, 3))
    si = (xb.float().var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()
    out.append(("batch_norm_backward 8x64x28x28",
                lambda: ops.batch_norm_backward(dyb, xb, sm, si, wb),
                lambda: aten.native_batch_norm_backward(dyb, xb, wb, None, None, sm, si, True,
                                                        1e-5, [True, True, True])))
    # softmax 64 x 128
    y = torch.softmax(torch.randn(64, 128, device=dev, dtype=f16), -1)
    dys = torch.randn_like(y)
    out.append(("softmax_backward 64x128", lambda: ops.softmax_backward(y, dys),
                lambda: aten._softmax_backward_data(dys, y, -1, f16)))
    # relu 64 x 768
    xr, dyr = torch.randn(64, 768, device=dev, dtype=f16), torch.randn(64, 768, device=dev,
                                                                      dtype=f16)
    out.append(("relu_backward 64x768", lambda: ops.relu_backward(dyr, xr),
                lambda: aten.threshold_backward(dyr, xr, 0)))
    # conv dgrad 8 x 64 x 28 x 28, 3x3, NHWC
    xc = torch.randn(8, 64, 28, 28, device=dev, dtype=f16).to(
        memory_format=torch.channels_last)
    wc = torch.randn(64, 64, 3, 3, device=dev, dtype=f16).to(memory_format=torch.channels_last)
    dyc = torch.randn(8, 64, 28, 28, device=dev, dtype=f16).to(
        memory_format=torch.channels_last)
    nhwc = (8, 28, 28, 64)
    dy_nhwc, w_nhwc = dyc.permute(0, 2, 3, 1), wc.permute(0, 2, 3, 1)
    out.append(("conv2d_backward_data 8x64x28x28 NHWC",
                lambda: ops.conv2d_backward_data(dy_nhwc, w_nhwc, nhwc, 1, 1, layout="NHWC"),
                lambda: aten.convolution_backward(dyc, xc, wc, None, [1, 1], [1, 1], [1, 1],
                                                  False, [0, 0], 1, [True, False, False])))
    return out


def main() -> int:
    import torch

    rows = []
    for name, ours, theirs in cases(torch):
        try:
            ours()
            o = _torch_bench.wall_us(ours, n=400)
        except Exception as exc:  # a row says what failed, the others still run
            rows.append({"call": name, "note": f"{type(exc).__name__}: {exc}"[:120]})
            continue
        t = _torch_bench.wall_us(theirs, n=400)
        rows.append({"call": name, "dnnctl_us": o, "torch_us": t, "extra_us": o - t})
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print(common.markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
