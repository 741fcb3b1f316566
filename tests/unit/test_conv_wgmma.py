"""conv2d ``implicit_gemm_wgmma`` without a GPU: support reasons, channel padding, exact
workspaces, default parameters; the kernels (implicit_gemm_wgmma.cu + implicit_gemm_pad.cu)
on the CPU emulator through the variant's own build(); NVRTC compiles of its builds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from _emu_helpers import emu_fixture, needs_emu
from _nvrtc_helpers import nvrtc

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.conv2d.implicit_gemm_wgmma import padded_channels
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = DeviceInfo(backend="cupy", index=0, name="NVIDIA A100", compute_capability="8.0",
                  sm_count=108, smem_per_block_optin=163 * 1024)
CONV = get_op("conv2d")
V = get_variant("conv2d", "cupy", "implicit_gemm_wgmma")
ROOT = Path(__file__).resolve().parents[2]


def conv(**kw):
    return CONV.problem(dict({"dtype": "float16", "layout": "NHWC"}, **kw))


def _p(bm, bn, warps, stages, splitk=1):
    return {"bm": bm, "bn": bn, "bk": 64, "warps": warps, "stages": stages, "splitk": splitk}


def test_padded_channels():
    assert [padded_channels(c) for c in (1, 2, 3, 4, 5, 7, 8, 12, 13, 64)] == \
        [4, 4, 4, 4, 8, 8, 8, 12, 16, 64]


def test_supports_reasons():
    base = dict(n=2, c=32, h=8, w=8, k=32, r=3, s=3, pad=1)
    assert V.supports(conv(**base), H200)
    assert V.supports(conv(**dict(base, c=3)), H200)  # padded, not refused
    assert "NHWC" in V.supports(conv(**base, layout="NCHW"), H200).reason
    assert "depthwise" in V.supports(conv(**dict(base, groups=32)), H200).reason
    assert "sm_90a" in V.supports(conv(**base), A100).reason
    fp32 = CONV.problem(dict(base, dtype="float32", layout="NHWC", tf32=True))
    assert "float16" in V.supports(fp32, H200).reason


def test_workspace_is_exact():
    conv1 = conv(n=32, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3, bias=True)
    params = V.default_params(conv1, H200)
    assert params is not None and params["splitk"] == 1
    x_pad = 32 * 224 * 224 * 4 * 2
    w_pad = 64 * 49 * 4 * 2
    rnd = lambda b: -(-b // 256) * 256  # noqa: E731
    assert V.workspace_bytes(conv1, params) == rnd(x_pad) + rnd(w_pad)
    deep = conv(n=1, c=512, h=7, w=7, k=512, r=3, s=3, pad=1)
    sk = _p(64, 128, 4, 4, 8)
    assert V.valid_params(deep, sk, H200)
    assert V.workspace_bytes(deep, sk) == rnd(8 * 49 * 512 * 4)
    assert V.workspace_bytes(deep, dict(sk, splitk=1)) == 0


@pytest.mark.parametrize("case", [
    dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
    dict(n=32, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3),
    dict(n=32, c=512, h=7, w=7, k=512, r=3, s=3, pad=1),
    dict(n=2, c=13, h=9, w=11, k=10, r=3, s=3, pad=[1, 0, 0, 1], dilation=2),
    dict(n=8, c=256, h=14, w=14, k=1024, r=1, s=1),
    dict(n=2, c=32, h=9, w=9, k=48, r=3, s=3, pad=1, groups=2),
], ids=lambda c: "-".join(map(str, c.values())))
def test_defaults_are_valid(case):
    for dtype in ("float16", "bfloat16"):
        p = conv(**case, dtype=dtype)
        d = V.default_params(p, H200)
        assert d is not None and V.check_params(d) is None and V.valid_params(p, d, H200)
    small = V.default_params(conv(**dict(case, n=1)), H200)
    assert small is not None


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture()


EMU_CASES = [
    # conv1-like: C = 3 padded to 4, 7x7 stride 2, bias
    (dict(n=1, c=3, h=17, w=15, k=16, r=7, s=7, stride=2, pad=3, bias=True), _p(64, 64, 4, 3)),
    # groups, every epilogue term, bf16
    (dict(n=2, c=16, h=9, w=9, k=24, r=3, s=3, pad=1, groups=2, bias=True, activation="silu",
          residual=True, dtype="bfloat16"), _p(64, 64, 4, 4)),
    # C = 12: 8-byte pieces without padding, asymmetric padding
    (dict(n=1, c=12, h=7, w=6, k=20, r=3, s=3, stride=2, pad=[1, 0, 1, 2], bias=True,
          residual=True, activation="relu"), _p(64, 64, 4, 3)),
    # C = 13 padded to 16, dilation 2
    (dict(n=1, c=13, h=9, w=11, k=10, r=3, s=3, pad=2, dilation=2, bias=True,
          dtype="bfloat16"), _p(64, 64, 4, 3)),
    # deep reduction on a small map: split-K with the finish kernel, gelu
    (dict(n=1, c=64, h=7, w=7, k=64, r=3, s=3, pad=1, bias=True, activation="gelu"),
     _p(64, 64, 4, 3, 4)),
    # 1x1, two warpgroups
    (dict(n=2, c=64, h=7, w=9, k=72, r=1, s=1, residual=True, dtype="bfloat16"),
     _p(128, 128, 8, 4)),
]


@needs_emu
@pytest.mark.parametrize(("key", "params"), EMU_CASES,
                         ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_kernel_on_cpu_emulator(emu, key, params):
    from dnnctl.ops.check import check_variant

    p = conv(**key)
    dev = emu.device(0)
    assert V.supports(p, dev) and V.check_params(params) is None
    res = check_variant(CONV, p, V, params, emu, dev, seed=5)
    assert res.ok, res.detail
    assert res.max_rel_err < CONV.tolerance(p, "y") / 2
    assert np.isfinite(res.max_rel_err)


# ----------------------------------------------------------------------------- NVRTC


def test_builds_compile_with_nvrtc(monkeypatch):
    nvrtc_compile = nvrtc()
    import os

    from dnnctl.backends import registry as base
    from dnnctl.resources import kernels_dir

    builds = set()

    class _Rec:
        xp = np

        def compile_module(self, source, *, defines=None, name_expressions=(), options=(),
                           device=None):
            builds.add((source, tuple(sorted((defines or {}).items()))))

            class _Mod:
                def get_function(self, name):
                    return self

            return _Mod()

    monkeypatch.setitem(base._BACKENDS, "cupy", _Rec())
    for key, params in [
        (dict(n=32, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3, bias=True), None),
        (dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1, residual=True, dtype="bfloat16"),
         None),
        (dict(n=32, c=512, h=7, w=7, k=512, r=3, s=3, pad=1, bias=True, activation="relu"),
         _p(128, 256, 8, 4, 2)),
        (dict(n=8, c=96, h=14, w=14, k=96, r=3, s=3, pad=1, bias=True, activation="relu6"),
         None),
    ]:
        p = conv(**key)
        V.build(p, params or V.default_params(p, H200), H200)
    assert {s for s, _ in builds} >= {"conv2d/implicit_gemm_wgmma.cu",
                                      "conv2d/implicit_gemm_pad.cu", "gemm/epilogue.cu"}
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    for src, defs in sorted(builds):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}", f"-I{inc}",
                "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={int(v)}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        assert ok, f"{src} {dict(defs)}:\n{log}"
    sys.modules.pop("tools.nvrtc_check", None)
