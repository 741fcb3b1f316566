"""Where a conv2d variant's time goes, and what the cuDNN routes torch offers take, on given
conv keys (one JSON key per line, or a plan's conv2d entries).

    PYTHONPATH=. python3 tools/conv_probe.py PLAN.yaml [--variants im2col_gemm,...]

For each key: torch F.conv2d (cuDNN, benchmark on) with the bias, + the activation /
residual as separate torch ops, torch.cudnn_convolution_relu where the key is conv + bias +
ReLU; every listed dnnctl variant at its default parameters (median us, CUDA events, L2
flush), and a profiler split of each variant's kernels (GPU us per kernel name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402


def _keys(path: str) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip().removeprefix("- ")
        if '"op": "conv2d"' in line:
            out.append(json.loads(line)["key"])
        elif line.startswith("{") and '"c"' in line:
            out.append(json.loads(line))
    return out


def _split(fn, calls: int = 20) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    parts = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / calls
            parts.append((us, e.key[:38]))
    parts.sort(reverse=True)
    return "; ".join(f"{n} {us:.1f}" for us, n in parts[:4])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("keys")
    ap.add_argument("--variants", default="torch_cudnn,im2col_gemm,implicit_gemm_wgmma,"
                    "gemm_1x1,implicit_gemm")
    args = ap.parse_args()
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from dnnctl.ops.registry import get_op, get_variant

    torch.backends.cudnn.benchmark = True
    dev = common.backend().device(0)
    op = get_op("conv2d")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    for key in _keys(args.keys):
        problem = op.problem(key)
        n, c, h, w, k, r = key["n"], key["c"], key["h"], key["w"], key["k"], key["r"]
        st, pad = key["stride"], key["pad"]
        dt = getattr(torch, key["dtype"])
        x = torch.randn(n, c, h, w, device="cuda").to(dt).contiguous(
            memory_format=torch.channels_last)
        wt = (torch.randn(k, c, r, key["s"], device="cuda") / (c * r) ** 0.5).to(dt).contiguous(
            memory_format=torch.channels_last)
        b = torch.randn(k, device="cuda").to(dt) if key["bias"] else None
        y0 = F.conv2d(x, wt, b, st, pad[:2] if len(pad) == 2 else (pad[0], pad[2]))
        res = torch.randn_like(y0) if key["residual"] else None
        p2 = (pad[0], pad[-1]) if len(pad) == 4 else tuple(pad)
        act = key["activation"]

        def torch_conv(x=x, wt=wt, b=b, st=st, p2=p2, res=res, act=act):
            y = F.conv2d(x, wt, b, st, p2)
            if act == "relu":
                y = F.relu_(y)
            if res is not None:
                y = y.add_(res)
            return y

        ref = torch_conv().float()
        row = {"key": f"c{c} k{k} {h}x{w} r{r} s{st[0]} {act} res={key['residual']}",
               "cudnn": common.time_us(torch_conv, budget_ms=40)["median_us"],
               "cudnn_split": _split(torch_conv)}
        if act == "relu" and res is None and hasattr(torch, "cudnn_convolution_relu"):
            def fused(x=x, wt=wt, b=b, st=st, p2=p2):
                return torch.cudnn_convolution_relu(x, wt, b, st, p2, (1, 1), 1)
            try:
                err = float((fused().float() - ref).norm() / ref.norm())
                row["cudnn_relu_fused"] = common.time_us(fused, budget_ms=40)["median_us"]
                row["cudnn_relu_err"] = err
            except Exception as exc:  # noqa: BLE001
                row["cudnn_relu_fused"] = f"{type(exc).__name__}: {exc}"[:120]
        ins = {"x": cp.from_dlpack(x.permute(0, 2, 3, 1)),
               "w": cp.from_dlpack(wt.permute(0, 2, 3, 1))}
        if b is not None:
            ins["bias"] = cp.from_dlpack(b)
        if res is not None:
            ins["residual"] = cp.from_dlpack(res.permute(0, 2, 3, 1))
        yt = torch.empty_like(y0)
        outs = {"y": cp.from_dlpack(yt.permute(0, 2, 3, 1))}
        for vname in args.variants.split(","):
            variant = get_variant("conv2d", "cupy", vname)
            if not variant.supports(problem, dev):
                continue
            tries = [variant.default_params(problem, dev)]
            if vname == "torch_cudnn" and variant.valid_params(problem, {"fuse": 1}, dev):
                tries.append({"fuse": 1})
            for params in tries:
                if params is None:
                    continue
                label = vname + ("_fused" if params.get("fuse") else "")
                try:
                    kern = variant.build(problem, params, dev)
                    # an adopting kernel (the vendor) is timed as the pipeline calls it:
                    # no output passed, the library's own returned
                    o_ = {} if getattr(kern, "adopts", False) else outs
                    yt.fill_(float("nan"))
                    made = kern(ins, o_, {})
                    torch.cuda.synchronize()
                    got = torch.from_dlpack(made["y"]).permute(0, 3, 1, 2) if o_ == {} else yt
                    err = float((got.float() - ref).norm() / ref.norm())

                    def call(k_=kern, i_=ins, o_=o_):
                        return k_(i_, o_, {})

                    row[label] = common.time_us(call, budget_ms=40)["median_us"]
                    row[label + "_err"] = round(err, 5)
                    row[label + "_split"] = _split(call)
                    del made
                except Exception as exc:  # noqa: BLE001
                    row[label] = f"{type(exc).__name__}: {exc}"[:120]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
