"""Host time of training steps, eager against patched, with the GPU held behind a sleep (so
no call waits for the device and every number is host time only).

Two parts:

- blocks: one small training unit (a conv, BN + ReLU, conv + BN + ReLU, a linear, a
  layer_norm, a GELU), forward + backward, host us per iteration;
- models: a whole ResNet-50 (batch 64, fp16 autocast, channels_last) and ViT-B/16 block
  stack (bf16 autocast) forward + backward, eager and each backward mode: the host's time
  to enqueue a step (not held: a whole step's launches would fill the launch queue behind a
  sleep) and the step's wall time to a synchronize, medians of 10;
  then the top of a cProfile of the patched ResNet-50 step.

    PYTHONPATH=. python3 tools/train_host.py [--parts blocks,models,profile]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.host_probe import held  # noqa: E402


def _blocks() -> list[tuple[str, Any, Any, Any]]:
    """(label, module factory, input factory, autocast dtype)."""
    import torch
    from torch import nn

    cl = torch.channels_last

    def img(c: int, hw: int) -> Any:
        return lambda: torch.randn(8, c, hw, hw, device="cuda").to(memory_format=cl)

    def tok() -> Any:
        return torch.randn(4, 197, 768, device="cuda")

    return [
        ("conv3x3 64", lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False), img(64, 28),
         torch.float16),
        ("bn+relu 64", lambda: nn.Sequential(nn.BatchNorm2d(64), nn.ReLU(inplace=True)),
         img(64, 28), torch.float16),
        ("conv+bn+relu 64", lambda: nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False),
                                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True)),
         img(64, 28), torch.float16),
        ("linear 768x3072", lambda: nn.Linear(768, 3072), tok, torch.bfloat16),
        ("layer_norm 768", lambda: nn.LayerNorm(768), tok, torch.bfloat16),
        ("gelu", lambda: nn.Sequential(nn.Linear(768, 768), nn.GELU()), tok, torch.bfloat16),
    ]


def blocks(modes: list[str]) -> None:
    import torch

    import dnnctl.torch as dt

    print("## one block, forward + backward: host us per iteration (GPU held)\n")
    print("| block | eager | " + " | ".join(f"patched {m}" for m in modes) + " |")
    print("|---|---:|" + "---:|" * len(modes))
    for label, make, data, low in _blocks():
        torch.manual_seed(0)
        base = make().cuda().to(memory_format=torch.channels_last).train()
        x = data().requires_grad_(True)
        row = []
        for way in ["eager", *modes]:
            m = copy.deepcopy(base)
            if way != "eager":
                dt.patch(m, None, backward=way)
            row.append(held(_step(m, x, low), 20, reps=5, warm=3))
        print(f"| {label} | " + " | ".join(f"{v:.0f}" for v in row) + " |")


def _step(model: Any, x: Any, low: Any) -> Any:
    import torch

    def it() -> None:
        with torch.autocast("cuda", dtype=low):
            y = model(x)
        y.float().sum().backward()
    return it


def _models() -> list[tuple[str, Any, Any, Any]]:
    import bench_train as bt
    import torch

    cfgs = bt.configs(False, "cuda")
    out = []
    for name in ("resnet50", "vit"):
        cfg = cfgs[name]
        g = torch.Generator().manual_seed(0)
        x, _ = cfg.data(g)
        x = x.cuda()
        if cfg.channels_last:
            x = x.to(memory_format=torch.channels_last)
        out.append((cfg.name, cfg, x, cfg.amp))
    return out


def _build(cfg: Any) -> Any:
    import torch

    m = cfg.build().cuda().train()
    return m.to(memory_format=torch.channels_last) if cfg.channels_last else m


def models(modes: list[str]) -> None:
    import torch

    import dnnctl.torch as dt

    print("\n## whole model, forward + backward: host ms to enqueue a step / wall ms\n")
    print("| model | eager | " + " | ".join(f"patched {m}" for m in modes) + " |")
    print("|---|---:|" + "---:|" * len(modes))
    for label, cfg, x, low in _models():
        row = []
        for way in ["eager", *modes]:
            m = _build(cfg)
            if way != "eager":
                dt.patch(m, None, backward=way)
            it = _step(m, x, low)
            for _ in range(3):
                it()
            host, wall = [], []
            for _ in range(10):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                it()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                host.append((t1 - t0) * 1e3)
                wall.append((time.perf_counter() - t0) * 1e3)
            row.append(f"{statistics.median(host):.1f} / {statistics.median(wall):.1f}")
            del m, it
            torch.cuda.empty_cache()
        print(f"| {label} | " + " | ".join(row) + " |")


def profile(mode: str, top: int) -> None:
    import torch

    import dnnctl.torch as dt

    label, cfg, x, low = _models()[0]
    m = _build(cfg)
    dt.patch(m, None, backward=mode)
    it = _step(m, x, low)
    for _ in range(3):
        it()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    it()
    prof.disable()
    torch.cuda.synchronize()
    print(f"\n## cProfile of one patched {label} step (backward={mode})\n")
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumtime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="blocks,models,profile")
    p.add_argument("--modes", default="plan,dnnctl", help="patched backward modes")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)
    parts, modes = a.parts.split(","), a.modes.split(",")
    if "blocks" in parts:
        blocks(modes)
    if "models" in parts:
        models(modes)
    if "profile" in parts:
        profile(modes[0], a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
