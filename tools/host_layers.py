"""One patched call's host time, layer by layer, from the module down to the driver call
(GPU held behind a sleep, so every number is host time only; median of samples).

    PYTHONPATH=. python3 tools/host_layers.py

Each row times the call from that layer inward; the difference between two rows is what the
outer layer adds. torch's own call for the same problem is the first row.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.host_probe import held as _held  # noqa: E402

PROFILE: list[tuple[str, Any]] = []  # (label, call) to cProfile after the timings
SLEEP = 60_000_000  # cycles: ~35 ms, longer than the loops below


def held(fn: Any, n: int = 100, reps: int = 9) -> float:
    """Median host us per call with the GPU held (tools/host_probe.py's, a shorter sleep)."""
    return _held(fn, n, reps=reps, sleep=SLEEP, warm=10)


def n_of(label: str) -> int:
    """Calls per sample: few for a conv, whose several launches would fill the launch
    queue behind the sleep (the host would then wait for the device)."""
    return 20 if label.startswith("[") else 100


def last_site(op: str | None = None) -> Any:
    """The newest call site (of ``op``: a conv's kernel may make nested calls of others)."""
    from dnnctl.ops import dispatch

    return next(s for s in reversed(dispatch._SITES.values())
                if op is None or s.op.name == op)


def site_layers(rows: list[tuple[str, Any]], site: Any, arrays: tuple, tag: str = "") -> None:
    """The site's own call, its kernel, and the pieces of the site's fast path."""
    kern, flat, adopt = site.kernel(None)
    rows.append((tag + "Site.__call__", lambda: site(arrays, None)))
    outs = {n: (site.empty(s, d) if like < 0 else site.empty_like(arrays[like]))
            for n, s, d, like in site.outputs}
    ins = {n: arrays[i] for n, i in site.flat_inputs if arrays[i] is not None}
    ins.update(site.consts)

    def kernel_only() -> None:
        tok = site.enter()
        kern(ins, outs, site.attrs)
        site.leave(tok)
    rows.append((tag + "enter + kernel + leave", kernel_only))
    rows.append((tag + "enter + leave", lambda: site.leave(site.enter())))
    for n, s, d, like in site.outputs:
        if like < 0:
            rows.append((tag + f"output {n}: new_empty", lambda s=s, d=d: site.empty(s, d)))
        else:
            rows.append((tag + f"output {n}: empty_like", lambda a=arrays[like]: site.empty_like(a)))
    from dnnctl.ops.adapters import SIGNATURES

    rows.append((tag + "signature of the arrays",
                 lambda: [SIGNATURES[a.__class__](a) for a in arrays]))


def linear_rows() -> list[tuple[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import dnnctl.ops as dops
    import dnnctl.torch as dt
    from dnnctl.torch import kernels
    from dnnctl.torch.library import run_op

    m = nn.Linear(768, 2304).cuda().half().eval()
    x = torch.randn(32, 197, 768, device="cuda", dtype=torch.float16)
    w, b = m.weight, m.bias
    rows: list[tuple[str, Any]] = [("torch F.linear", lambda: F.linear(x, w, b))]
    wrapper = nn.Sequential(m)
    dt.patch(wrapper, None, trace=False)
    rows.append(("patched nn.Linear module", lambda: m(x)))
    rows.append(("run_op('linear')", lambda: run_op("linear", x, w, b, "none", 0)))
    rows.append(("kernels.linear", lambda: kernels.linear(x, w, b, "none", 0)))
    x2, wt = x.reshape(-1, 768), w.t()
    rows.append(("dnnctl.ops.matmul(x2, w.t(), b)", lambda: dops.matmul(x2, wt, b)))
    dops.matmul(x2, wt, b)
    site_layers(rows, last_site(), (x2, wt, b))
    kern = last_site().kernel(None)[0]
    plan = getattr(kern, "keep", None)
    if plan is not None:
        from dnnctl.backends import cuda

        pa, pb, py, pbias = x2.data_ptr(), wt.data_ptr(), torch.empty(
            6304, 2304, device="cuda", dtype=torch.float16).data_ptr(), b.data_ptr()
        rows.append(("LtPlan call (pointers)",
                     lambda: plan(0, cuda.current_stream(), pa, pb, py, pbias)))
    rows.append(("reshape + w.t() + contiguous",
                 lambda: (x.reshape(-1, 768).contiguous(), w.t())))
    return rows


def layer_norm_rows() -> list[tuple[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import dnnctl.ops as dops
    import dnnctl.torch as dt
    from dnnctl.torch import kernels

    m = nn.LayerNorm(768).cuda().half().eval()
    x = torch.randn(32, 197, 768, device="cuda", dtype=torch.float16)
    rows: list[tuple[str, Any]] = [
        ("torch F.layer_norm", lambda: F.layer_norm(x, (768,), m.weight, m.bias, 1e-5))]
    dt.patch(nn.Sequential(m), None, trace=False)
    rows.append(("patched nn.LayerNorm module", lambda: m(x)))
    rows.append(("kernels.layer_norm",
                 lambda: kernels.layer_norm(x, m.weight, m.bias, 1e-5, 0)))
    x2 = x.reshape(-1, 768)
    rows.append(("dnnctl.ops.layer_norm", lambda: dops.layer_norm(x2, m.weight, m.bias)))
    dops.layer_norm(x2, m.weight, m.bias)
    site_layers(rows, last_site(), (x2, m.weight, m.bias))
    return rows


def resnet_conv_rows() -> list[tuple[str, Any]]:
    """Three FusedConv calls of a patched ResNet-50 b32 (a 3x3, a 1x1, a block end), with
    the inputs they get in the model, peeled from the module to the kernel."""

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import models

    import dnnctl.torch as dt
    from dnnctl.ops.conv2d.function import conv2d_channels_last
    from dnnctl.torch import kernels
    from dnnctl.torch.library import run_op

    model, (x,) = models.build("resnet50-b32")
    dt.patch(model, None)
    gm = model.__dict__["forward"].gm
    fused = [m for m in gm.modules() if type(m).__name__ == "FusedConv"]
    seen: dict[int, tuple] = {}
    hooks = [f.register_forward_pre_hook(
        lambda m, a: seen.setdefault(id(m), a)) for f in fused]
    model(x)
    for h in hooks:
        h.remove()
    rows: list[tuple[str, Any]] = [("whole patched forward, per FusedConv (53)",
                                    (lambda: model(x), 53))]
    picks = {}
    for f in fused:
        k = f.conv.kernel_size
        kind = ("block end" if len(seen[id(f)]) > 1 else f"{k[0]}x{k[1]}")
        picks.setdefault(kind, f)
    for kind, f in picks.items():
        args = seen[id(f)]
        xin, res = args[0], (args[1] if len(args) > 1 else None)
        conv = f.conv
        w, b = f._folded()
        st, pad, dil = f._geom[3], f._geom[4], f._geom[5]
        tag = f"{kind} {tuple(xin.shape)} k{conv.out_channels}"
        rows.append((f"[{tag}] FusedConv module", lambda f=f, a=args: f(*a)))
        rows.append((f"[{tag}] run_op", lambda xin=xin, w=w, b=b, st=st, pad=pad, dil=dil,
                     f=f, res=res: run_op("conv2d", xin, w, b, st, pad, dil, 1, f.act, res, 0,
                                          f.residual_before_act)))
        rows.append((f"[{tag}] kernels.conv2d", lambda xin=xin, w=w, b=b, st=st, pad=pad,
                     dil=dil, f=f, res=res: kernels.conv2d(
                         xin, w, b, st, pad, dil, 1, f.act, res, 0, f.residual_before_act)))
        act = None if f.act == "none" else f.act
        def cl(xin=xin, w=w, b=b, st=st, pad=pad, dil=dil, res=res, act=act, f=f):  # noqa: ANN001, ANN202
            return conv2d_channels_last(xin, w, b, stride=tuple(st), padding=tuple(pad),
                                        dilation=tuple(dil), groups=1, activation=act,
                                        residual=res, residual_before_act=f.residual_before_act)
        rows.append((f"[{tag}] conv2d_channels_last", cl))
        PROFILE.append((tag, lambda f=f, a=args: f(*a)))
        cl()
        site = last_site("conv2d")
        kern = site.kernel(None)[0]
        print(f"{tag}: variant {getattr(kern, '__qualname__', kern)} "
              f"choice {getattr(site, 'last', None)}")
        site_layers(rows, site, (xin, w, b, res), f"[{tag}] ")
    return rows


def vendor_gemms() -> None:
    """cuBLAS (cublasGemmStridedBatchedEx, its own algorithm choice per call) against
    cuBLASLt (the heuristic's algorithm cached per problem) on linear layers without an
    epilogue: host us per call (GPU held) and GPU us per call (events, host hidden)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import _torch_bench as tb

    import dnnctl.ops as dops
    from dnnctl.ops.base import Choice
    from dnnctl.ops.dispatch import problem_of
    from dnnctl.ops.registry import get_op
    from dnnctl.torch import keys

    print("\n## linear without epilogue: cublas vs cublaslt (bf16)")
    print("| m x n x k | torch host | cublas host | cublaslt host | torch GPU | cublas GPU |"
          " cublaslt GPU |\n|---|---:|---:|---:|---:|---:|---:|")
    op = get_op("matmul")
    for m, n, k in ((8, 4096, 4096), (8, 11008, 4096), (8, 4096, 11008), (2048, 4096, 4096),
                    (6304, 768, 3072)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        prob = problem_of(op, keys.linear(x, w, False, "none"))
        row = [f"{m}x{n}x{k}"]
        host, gpu = [], []
        ref = torch.nn.functional.linear(x, w)
        for name in ("torch", "cublas", "cublaslt"):
            if name == "torch":
                fn = lambda x=x, w=w: torch.nn.functional.linear(x, w)  # noqa: E731
            else:
                plan = tb.plan_with([(prob, Choice.of(name, {}))])
                wt = w.t()
                fn = lambda x=x, wt=wt, plan=plan: dops.matmul(x, wt, plan=plan)  # noqa: E731
                err = (fn().float() - ref.float()).abs().max().item()
                if err > 0.05 * ref.float().abs().max().item():
                    print(f"{name} {m}x{n}x{k}: max error {err}")
            host.append(held(fn))
            gpu.append(tb.kernel_us(fn, samples=30))
        row += [f"{h:.1f}" for h in host] + [f"{g:.1f}" for g in gpu]
        print("| " + " | ".join(row) + " |")


def main() -> int:
    import torch

    for title, make in (("linear 6304x768 -> 2304 + bias, fp16", linear_rows),
                        ("layer_norm 6304x768 fp16", layer_norm_rows),
                        ("ResNet-50 b32 FusedConv calls", resnet_conv_rows)):
        try:
            rows = make()  # (outside inference mode, as a model is built)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"\n## {title}: failed: {exc!r}")
            continue
        with torch.inference_mode():
            print(f"\n## {title}\n| layer | host us / call |\n|---|---:|")
            for label, fn in rows:
                try:
                    if isinstance(fn, tuple):  # (fn, calls it makes): per call
                        print(f"| {label} | {held(fn[0], n=2) / fn[1]:.1f} |")
                    else:
                        print(f"| {label} | {held(fn, n=n_of(label)):.1f} |")
                except Exception as exc:  # noqa: BLE001
                    print(f"| {label} | failed: {exc!r} |")
        for label, fn in PROFILE:
            cprofile(label, fn)
        PROFILE.clear()
    with torch.inference_mode():
        vendor_gemms()
    return 0


def cprofile(label: str, fn: Any, n: int = 200, top: int = 18) -> None:
    """tools/e2e_profile.py's cProfile table of ``fn``, per call, in inference mode."""
    import torch

    from tools.e2e_profile import _cprofile

    with torch.inference_mode():
        _cprofile(fn, label, top, n=n, per="call")


if __name__ == "__main__":
    sys.exit(main())
