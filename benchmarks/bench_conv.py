"""conv2d: dnnctl's best variant per shape against torch.nn.functional.conv2d (cuDNN).

Shapes: every distinct convolution of ResNet-50 v1.5 (torchvision: stride in the 3x3 conv;
23 distinct layers; v1, with the stride in the first 1x1, has 20) at batch 1, 32 and 256,
plus the distinct depthwise 3x3 layers of MobileNetV2, in fp16 NHWC and fp32 NCHW. Every
layer carries a bias (batch norm folded), as an inference graph runs it; torch gets the
same tensors (channels_last for NHWC) with torch.backends.cudnn.benchmark = True. fp32 rows
allow TF32 on both sides, as torch does by default for cuDNN convolutions
(torch.backends.cudnn.allow_tf32); set DNNCTL_BENCH_TF32=0 for strict fp32 on both.

For each shape, every registered cupy conv2d variant that supports it is tried with its
default parameters plus a small deterministic sweep (at most CAP candidates per shape), each
checked once against torch's output (a wrong candidate cannot win), timed briefly; the
fastest is re-timed with the full budget next to cuDNN. A global time budget keeps the full
run near 6 minutes: rows it cannot reach are listed as skipped, never silently dropped.

    PYTHONPATH=. python3 benchmarks/run.py --only conv [--quick]
    PYTHONPATH=. python3 benchmarks/bench_conv.py [--quick]
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

TITLE = "conv2d: dnnctl best variant vs torch/cuDNN (cudnn.benchmark=True)"
CAP = 8  # candidates per shape
EXTRA_PER_VARIANT = 2  # sweep points besides the default parameters
BUDGET_S = 330.0  # stop starting new rows after this (the full run must fit ~6 minutes)
WS_LIMIT = 8 << 30


def resnet50_layers() -> list[tuple[str, dict[str, int]]]:
    """Distinct convolutions of ResNet-50 v1.5: (name, c, h, k, r, stride, pad)."""
    out = [("conv1 7x7/2", dict(c=3, h=224, k=64, r=7, stride=2, pad=3))]
    seen = {(3, 224, 64, 7, 2)}
    cin, h = 64, 56
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                      (512, 3, 2)), start=1):
        cout = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            h2 = h // s
            convs = [("1x1a", cin, h, width, 1, 1), ("3x3", width, h, width, 3, s)]
            if b == 0:
                convs.append(("proj", cin, h, cout, 1, s))
            convs.append(("1x1b", width, h2, cout, 1, 1))
            for tag, c, hh, k, r, st in convs:
                if (c, hh, k, r, st) in seen:
                    continue
                seen.add((c, hh, k, r, st))
                name = f"s{stage} {tag} {c}->{k} @{hh}" + (f"/{st}" if st > 1 else "")
                out.append((name, dict(c=c, h=hh, k=k, r=r, stride=st, pad=r // 2)))
            h, cin = h2, cout
    return out


def mobilenet_v2_depthwise() -> list[tuple[str, dict[str, int]]]:
    """Distinct depthwise 3x3 layers of MobileNetV2 1.0 at 224x224."""
    spec = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))
    out, seen = [], set()
    cin, h = 32, 112
    for t, c, n, s in spec:
        for i in range(n):
            st = s if i == 0 else 1
            hidden = cin * t
            if (hidden, h, st) not in seen:
                seen.add((hidden, h, st))
                out.append((f"mbv2 dw {hidden} @{h}" + (f"/{st}" if st > 1 else ""),
                            dict(c=hidden, h=h, k=hidden, r=3, stride=st, pad=1,
                                 groups=hidden)))
            h, cin = -(-h // st), c
    return out


def _sweep(space: list[dict], extra: int) -> list[dict]:
    if not space or extra <= 0:
        return []
    step = max(1, len(space) // (extra + 1))
    return [space[i] for i in range(step, len(space), step)][:extra]


def candidates(op: Any, problem: Any, device: Any, quick: bool) -> list[tuple[Any, dict]]:
    from dnnctl.ops.conv2d.op import default_params
    from dnnctl.ops.registry import variants

    first, rest = [], []
    for v in variants("conv2d", "cupy"):
        if not v.supports(problem, device):
            continue
        d = default_params(v, problem, device)
        if d is not None and v.workspace_bytes(problem, d) <= WS_LIMIT:
            first.append((v, d))
        for p in _sweep(list(v.param_space(problem, device)), 0 if quick else EXTRA_PER_VARIANT):
            if p != d and v.workspace_bytes(problem, p) <= WS_LIMIT:
                rest.append((v, p))
    return (first + rest)[:CAP]


def bench_shape(name: str, shape: dict, batch: int, dtype: str, layout: str, tf32: bool,
                quick: bool) -> dict[str, Any]:
    import cupy as cp
    import torch

    from dnnctl.ops.registry import get_op

    op = get_op("conv2d")
    be = common.backend()
    dev = be.device(cp.cuda.Device().id)
    c, h, k, r = shape["c"], shape["h"], shape["k"], shape["r"]
    st, pad, groups = shape["stride"], shape["pad"], shape.get("groups", 1)
    problem = op.problem(n=batch, c=c, h=h, w=h, k=k, r=r, s=r, stride=st, pad=pad,
                         groups=groups, dtype=dtype, layout=layout, bias=True,
                         tf32=tf32 and dtype == "float32")
    tdt = getattr(torch, dtype)
    tdev = torch.device("cuda")
    x = torch.randn(batch, c, h, h, device=tdev).to(tdt)
    w = (torch.randn(k, c // groups, r, r, device=tdev) / math.sqrt(c // groups * r * r)).to(tdt)
    b = torch.randn(k, device=tdev).to(tdt)
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    f = torch.nn.functional

    def torch_fn() -> Any:
        return f.conv2d(x, w, b, stride=st, padding=pad, groups=groups)

    ref = torch_fn()
    perm = (lambda t: t.permute(0, 2, 3, 1)) if layout == "NHWC" else (lambda t: t)
    inputs = {"x": cp.from_dlpack(perm(x).detach()), "w": cp.from_dlpack(perm(w).detach()),
              "bias": cp.from_dlpack(b)}
    ref_cp = cp.from_dlpack(perm(ref).contiguous()).astype(cp.float32)
    ref_norm = float(cp.linalg.norm(ref_cp))
    y = cp.empty(op.output_specs(problem)["y"].shape, dtype=inputs["x"].dtype)
    tol = 2e-2 if dtype != "float32" else 1e-2
    best, best_us, best_kern, best_err, tried, wrong = None, math.inf, None, math.nan, 0, 0
    for variant, params in candidates(op, problem, dev, quick):
        try:
            kern = variant.build(problem, params, dev)
            y.fill(float("nan"))
            kern(inputs, {"y": y}, {})
            err = float(cp.linalg.norm(y.astype(cp.float32) - ref_cp)) / ref_norm
        except Exception as exc:  # a failed candidate is skipped, as the tuner does
            print(f"  [{name} b{batch}] {variant.name}{params}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            wrong += 1
            continue
        tried += 1
        if not err <= tol:
            wrong += 1
            continue
        t = common.time_us(lambda kern=kern: kern(inputs, {"y": y}, {}), warmup_ms=3,
                           budget_ms=10)["median_us"]
        if t < best_us:
            best, best_us, best_kern, best_err = (variant, params), t, kern, err
    row: dict[str, Any] = {"config": f"{dtype} {layout}", "layer": name, "batch": batch}
    cudnn = common.time_us(torch_fn, warmup_ms=10, budget_ms=40)["median_us"]
    flops = op.flops(problem)
    if best is None or best_kern is None:
        row.update(best="(none)", ours_us=math.nan, cudnn_us=cudnn, ratio=math.nan)
        return row
    ours = common.time_us(lambda: best_kern(inputs, {"y": y}, {}), warmup_ms=10,
                          budget_ms=40)["median_us"]
    label = best[0].name + "(" + ",".join(f"{k}={v}" for k, v in sorted(best[1].items())) + ")"
    row.update(best=label, ours_us=ours, cudnn_us=cudnn, ratio=cudnn / ours,
               ours_tflops=flops / ours / 1e6, cudnn_tflops=flops / cudnn / 1e6,
               err_vs_torch=best_err, tried=tried, wrong=wrong)
    return row


def run(ctx: Any, quick: bool) -> list[dict[str, Any]]:
    import cupy as cp
    import torch

    torch.backends.cudnn.benchmark = True
    tf32 = os.environ.get("DNNCTL_BENCH_TF32", "1") != "0"
    torch.backends.cudnn.allow_tf32 = tf32
    layers = resnet50_layers() + mobilenet_v2_depthwise()
    if quick:
        keep = {"conv1 7x7/2", "s1 3x3 64->64 @56", "s2 3x3 128->128 @56/2",
                "s3 1x1b 256->1024 @14", "s4 3x3 512->512 @7", "mbv2 dw 96 @112/2",
                "mbv2 dw 576 @14"}
        layers = [entry for entry in layers if entry[0] in keep]
    batches = (32,) if quick else (1, 32, 256)
    plan = [(dt, lay, bt) for dt, lay in (("float16", "NHWC"), ("float32", "NCHW"))
            for bt in batches]
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    t0 = time.time()
    for dtype, layout, batch in plan:
        for name, shape in layers:
            if time.time() - t0 > BUDGET_S:
                skipped.append(f"{dtype} {layout} b{batch} {name}")
                continue
            try:
                rows.append(bench_shape(name, shape, batch, dtype, layout, tf32, quick))
            except Exception as exc:  # keep the section going; record the miss
                rows.append({"config": f"{dtype} {layout}", "layer": name, "batch": batch,
                             "best": f"error: {type(exc).__name__}: {exc}"[:120]})
            print(_progress(rows[-1]), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
            torch.cuda.empty_cache()
    if skipped:
        rows.append({"config": "skipped (time budget)", "layer": f"{len(skipped)} rows",
                     "best": "; ".join(skipped[:6]) + (" ..." if len(skipped) > 6 else "")})
    return rows


def _progress(row: dict[str, Any]) -> str:
    return (f"  {row.get('config')} b{row.get('batch')} {row.get('layer')}: "
            f"{row.get('best')} {row.get('ours_us', math.nan):.1f} us vs cuDNN "
            f"{row.get('cudnn_us', math.nan):.1f} us")


def summary(rows: list[dict[str, Any]], ctx: Any) -> str:
    """Geometric-mean speed ratio (cuDNN time / ours; > 1 means ours is faster), wins."""
    lines = []
    timed = [r for r in rows if isinstance(r.get("ratio"), float) and r["ratio"] > 0]
    groups: dict[str, list[dict[str, Any]]] = {"all": timed}
    for r in timed:
        groups.setdefault(r["config"], []).append(r)
        groups.setdefault(f"{r['config']} batch {r['batch']}", []).append(r)
    for gname, rs in groups.items():
        wins = sum(1 for r in rs if r["ratio"] >= 1.0)
        lines.append(f"- {gname}: geomean ratio {common.geomean([r['ratio'] for r in rs]):.3f}"
                     f" over {len(rs)} shapes; ours fastest on {wins}")
    misses = [r for r in rows if r not in timed]
    if misses:
        lines.append(f"- not timed: {len(misses)} rows (see table)")
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = run(None, args.quick)
    print(common.markdown(rows))
    print(summary(rows, None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
