#!/usr/bin/env python3
"""Depthwise convolution on the layers of published models, NHWC: dnnctl's ``depthwise``
(channel-vectorized, input rows re-read through L1 / L2) and ``depthwise_tile`` (input
window staged in shared memory) against torch's F.conv2d (cuDNN, channels_last), in one run;
for the stride-1 layers also the data gradient (``dgrad_depthwise`` /
``dgrad_depthwise_tile`` against cuDNN's).

Each candidate (the default and the block shapes of benchmarks/conv_candidates.py) is checked
against torch's fp32 result once (relative error < 1e-2) before it is timed (CUDA events,
L2 flushed, median). GB/s counts x + w + y once: the floor every kernel pays.

    PYTHONPATH=. python3 benchmarks/bench_depthwise.py [--quick]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
import conv_candidates  # noqa: E402

TITLE = "Depthwise conv2d, NHWC: depthwise / depthwise_tile vs cuDNN"

# (name, n, c, h, w, r, stride, dtype): depthwise layers of ConvNeXt-T, EfficientNet-B0,
# MobileNetV2 / V3 (one filter per channel)
LAYERS = [
    ("ConvNeXt-T 7x7 96 @56 b32", 32, 96, 56, 56, 7, 1, "float16"),
    ("ConvNeXt-T 7x7 384 @14 b32", 32, 384, 14, 14, 7, 1, "float16"),
    ("EfficientNet-B0 5x5 240 @28 b32", 32, 240, 28, 28, 5, 1, "float16"),
    ("EfficientNet-B0 5x5/2 144 @56 b32", 32, 144, 56, 56, 5, 2, "float16"),
    ("MobileNetV2 3x3/2 96 @112 b32", 32, 96, 112, 112, 3, 2, "float16"),
    ("MobileNetV2 3x3 384 @14 b32", 32, 384, 14, 14, 3, 1, "float16"),
    ("ConvNeXt-T 7x7 96 @56 b32 fp32", 32, 96, 56, 56, 7, 1, "float32"),
]
VARIANTS = ("depthwise", "depthwise_tile")


def _time_candidates(vname: str, problem: Any, dev: Any, ins: dict, outs: dict, dst: Any,
                     ref: Any, layer: str, rows: list[dict[str, Any]], limit: int | None
                     ) -> dict[str, float]:
    """{label: median us} of the shortlisted parameter sets of ``vname`` that pass the check
    against ``ref`` (``dst`` is the torch tensor the kernel writes); failures become note
    rows."""
    import torch

    from dnnctl.ops.registry import get_variant

    variant = get_variant("conv2d", "cupy", vname)
    if not variant.supports(problem, dev):
        return {}
    out: dict[str, float] = {}
    for params in conv_candidates.shortlist(variant, problem, dev)[:limit]:
        label = f"{vname} " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
        try:
            kern = variant.build(problem, params, dev)
            dst.fill_(float("nan"))
            kern(ins, outs, {})
            torch.cuda.synchronize()
            err = float((dst.float() - ref).norm() / ref.norm())
        except Exception as exc:  # reported, the run goes on
            rows.append({"layer": layer, "note": f"FAILED {label}: "
                         f"{type(exc).__name__}: {exc}"[:200]})
            continue
        if not err < 1e-2:
            rows.append({"layer": layer, "note": f"WRONG {label} err {err:.3g}"})
            continue
        out[label] = common.time_us(lambda k=kern, i=ins, o=outs: k(i, o, {}),
                                    budget_ms=40)["median_us"]
    return out


def _label(choice: Any) -> str:
    return f"{choice.variant} " + " ".join(f"{k}={v}" for k, v in sorted(choice.params))


def run(ctx: common.Ctx, quick: bool, on_layer: Any = None) -> list[dict[str, Any]]:
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from dnnctl.ops.conv2d.op import own_choice
    from dnnctl.ops.registry import get_op

    dev = common.backend().device(0)
    op = get_op("conv2d")
    rows: list[dict[str, Any]] = []
    layers = LAYERS[:3] if quick else LAYERS
    for i, (name, n, c, h, w, r, st, dtype) in enumerate(layers):
        print(f"[{i + 1}/{len(layers)}] {name}", file=sys.stderr, flush=True)
        tdt = getattr(torch, dtype)
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n, c, h, w, device="cuda", generator=g).to(tdt).contiguous(
            memory_format=torch.channels_last)
        wt = (torch.randn(c, 1, r, r, device="cuda", generator=g) / r).to(tdt)
        pad = r // 2
        ref = F.conv2d(x.float(), wt.float(), None, st, pad, 1, c)
        t_torch = common.time_us(lambda x=x, wt=wt, st=st, pad=pad, c=c:
                                 F.conv2d(x, wt, None, st, pad, 1, c), budget_ms=60)["median_us"]
        problem = op.problem(dict(n=n, c=c, h=h, w=w, k=c, r=r, s=r, stride=st, pad=pad,
                                  groups=c, dtype=dtype, layout="NHWC"))
        y = torch.empty_like(ref, dtype=tdt).contiguous(memory_format=torch.channels_last)
        ins = {"x": cp.from_dlpack(x.permute(0, 2, 3, 1)),
               "w": cp.from_dlpack(wt.permute(0, 2, 3, 1).contiguous())}
        outs = {"y": cp.from_dlpack(y.permute(0, 2, 3, 1))}
        nbytes = (x.numel() + wt.numel() + y.numel()) * x.element_size()
        row: dict[str, Any] = {"layer": name, "torch_us": t_torch}
        default = _label(own_choice(problem, "cupy", dev))
        for vname in VARIANTS:
            timed = _time_candidates(vname, problem, dev, ins, outs, y, ref, name, rows,
                                     2 if quick else None)
            if default in timed:
                row["default_us"] = timed[default]
            if timed:
                best = min(timed, key=timed.__getitem__)
                row[f"{vname}_us"], row[f"{vname}_best"] = timed[best], best
        times = [row[f"{v}_us"] for v in VARIANTS if f"{v}_us" in row]
        if times:
            row["best/torch"] = t_torch / min(times)
            row["best_GBps"] = nbytes / min(times) / 1e3
            row["pct_copy_bw"] = 100.0 * row["best_GBps"] / ctx.copy_gbps
        if "default_us" in row:
            row["default/torch"] = t_torch / row["default_us"]
        rows.append(row)
        if st == 1:
            rows.append(_dgrad_row(op, dev, name, x, wt, problem, rows))
        if on_layer is not None:
            on_layer(rows)
    return rows


def _dgrad_row(op: Any, dev: Any, name: str, x: Any, wt: Any, fwd: Any,
               rows: list[dict[str, Any]]) -> dict[str, Any]:
    """dx of a stride-1 layer: dgrad_depthwise / dgrad_depthwise_tile vs cuDNN's data
    gradient (aten.convolution_backward, input gradient only)."""
    import cupy as cp
    import torch

    c, r = x.shape[1], wt.shape[-1]
    pad = r // 2
    dy = torch.randn_like(x)
    ref = torch.nn.grad.conv2d_input(x.shape, wt.float(), dy.float(), 1, pad, 1, c)
    bwd = torch.ops.aten.convolution_backward.default

    def torch_fn(dy=dy, x=x, wt=wt, pad=pad, c=c):
        return bwd(dy, x, wt, None, [1, 1], [pad, pad], [1, 1], False, [0, 0], c,
                   [True, False, False])

    row: dict[str, Any] = {"layer": name + " dgrad",
                           "torch_us": common.time_us(torch_fn, budget_ms=60)["median_us"]}
    p = op.problem(dict(fwd.as_dict(), **{"pass": "dgrad"}))
    dx = torch.empty_like(x)
    ins = {"dy": cp.from_dlpack(dy.permute(0, 2, 3, 1)),
           "w": cp.from_dlpack(wt.permute(0, 2, 3, 1).contiguous())}
    outs = {"dx": cp.from_dlpack(dx.permute(0, 2, 3, 1))}
    for vname in ("dgrad_depthwise", "dgrad_depthwise_tile"):
        timed = _time_candidates(vname, p, dev, ins, outs, dx, ref, name, rows, 4)
        if timed:
            row[f"{vname}_us"] = min(timed.values())
    times = [row[f"{v}_us"] for v in ("dgrad_depthwise", "dgrad_depthwise_tile")
             if f"{v}_us" in row]
    if times:
        row["best/torch"] = row["torch_us"] / min(times)
    return row


def main() -> int:
    quick = "--quick" in sys.argv
    ctx = common.measure_ceilings()
    out = Path(os.environ.get("OUT") or ".devout")
    out.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict[str, Any]]) -> str:  # after every layer: a timeout keeps them
        text = ctx.header() + "\n\n" + common.markdown(rows)
        (out / "bench_depthwise.md").write_text(text)
        return text

    print(save(run(ctx, quick, save)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
