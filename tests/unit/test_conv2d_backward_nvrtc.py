"""Every kernel build the conv2d backward variants (and matmul_backward's pre-pass) ask for,
on training-like problems and both layouts / all dtypes, compiles with NVRTC under the exact
defines build() produces (sm_90a, as the cupy backend compiles; skipped without libnvrtc)."""

from __future__ import annotations

import os

import numpy as np
from _nvrtc_helpers import BuildRecorder, nvrtc

from dnnctl.backends import registry as base
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.op import default_params
from dnnctl.ops.registry import get_op, variants
from dnnctl.resources import kernels_dir

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)
SHAPES = [
    dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
    dict(n=32, c=128, h=57, w=57, k=256, r=3, s=3, stride=2, pad=1),
    dict(n=32, c=256, h=14, w=14, k=1024, r=1, s=1, stride=2),
    dict(n=8, c=3, h=224, w=224, k=768, r=16, s=16, stride=16),
    dict(n=8, c=96, h=28, w=28, k=96, r=3, s=3, pad=1, groups=96),
    dict(n=2, c=13, h=9, w=11, k=10, r=3, s=3, dilation=2, pad=2),
]


def test_backward_builds_compile_with_nvrtc(monkeypatch):
    nvrtc_compile = nvrtc()
    rec = BuildRecorder()
    monkeypatch.setitem(base._BACKENDS, "cupy", rec)
    # every backward variant compiled from our sources (the vendors run through torch)
    names = [v.name for v in variants("conv2d", "cupy")
             if "forward" not in v.passes and not v.vendor]
    built = set()
    with _cuda.use_runtime(rec):
        for name in names:
            v = next(x for x in variants("conv2d", "cupy") if x.name == name)
            for shape in SHAPES:
                for dtype, layout, tf32 in (("float16", "NHWC", False),
                                            ("bfloat16", "NCHW", False),
                                            ("float32", "NHWC", True),
                                            ("float32", "NCHW", False)):
                    which = v.passes[0]
                    p = OP.problem(dict(shape, dtype=dtype, layout=layout, tf32=tf32,
                                        bias=which == "wgrad", **{"pass": which}))
                    if v.supports(p, H200):
                        v.build(p, default_params(v, p, H200), H200)
                        built.add(name)
        from dnnctl.ops.matmul.backward import _prepass_cuda

        for act in ("none", "relu", "gelu", "silu"):
            dy = np.zeros((8, 16), np.float16)
            _prepass_cuda(dy, dy, act, True, np)
    assert built == set(names), set(names) - built  # every backward variant was built
    sources = {s for s, _ in rec.builds}
    assert sources >= {"conv2d/col2im.cu", "conv2d/bias_grad.cu", "conv2d/direct_bwd.cu",
                       "conv2d/dgrad_phase.cu", "conv2d/wgrad_implicit_gemm.cu",
                       "conv2d/implicit_gemm.cu", "conv2d/im2col.cu"}
    cuda_inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    failures = []
    for src, defs in sorted(rec.builds):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0",
                *(f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        if not ok:
            failures.append(f"{src} {defs}:\n{log[-2000:]}")
    assert not failures, "\n".join(failures[:3])
    assert len(rec.builds) >= 40
