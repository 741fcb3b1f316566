"""conv2d ``depthwise_tile`` (NHWC depthwise through shared memory): what it supports, its
parameter space against its shared-memory limit, a clean sm_90a build of its defaults on real
models' layers, and the kernel on the CPU emulator (tools/cuda_emu: cp.async copies pending
until waited for) against the float64 reference, forward and data gradient, one tile and
several a block (the GPU tests are in tests/gpu/test_conv2d.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from _emu_helpers import conv_emu_fixture, needs_emu
from _nvrtc_helpers import nvrtc

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.check import check_variant
from dnnctl.ops.conv2d.depthwise import TILE_SMEM_LIMIT, _tile_bytes, _tile_pad_bytes
from dnnctl.ops.conv2d.op import default_params, geometry
from dnnctl.ops.registry import get_op, get_variant
from dnnctl.resources import kernels_dir

OP = get_op("conv2d")
V = get_variant("conv2d", "cupy", "depthwise_tile")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)

# depthwise layers of published models, NHWC: ConvNeXt-T 7x7, EfficientNet-B0 5x5 / 5x5 s2,
# MobileNetV2 3x3 s2 at 112, a dilated 3x3
LAYERS = {
    "convnext_7x7_96@56": dict(n=32, c=96, h=56, w=56, k=96, r=7, s=7, pad=3, groups=96),
    "effnet_5x5_240@28": dict(n=32, c=240, h=28, w=28, k=240, r=5, s=5, pad=2, groups=240),
    "effnet_5x5s2_144@56": dict(n=32, c=144, h=56, w=56, k=144, r=5, s=5, stride=2, pad=2,
                                groups=144),
    "mbv2_3x3s2_96@112": dict(n=32, c=96, h=112, w=112, k=96, r=3, s=3, stride=2, pad=1,
                              groups=96),
    "dilated_3x3_64@33": dict(n=4, c=64, h=33, w=33, k=64, r=3, s=3, dilation=2, pad=2,
                              groups=64),
}


def _problem(key: dict, dtype: str = "float16", layout: str = "NHWC"):
    return OP.problem(dict(key, dtype=dtype, layout=layout))


def test_supports_names_what_it_does_not_take():
    base = LAYERS["convnext_7x7_96@56"]
    assert V.supports(_problem(base), H200)
    cases = {"NHWC only": _problem(base, layout="NCHW"),
             "K == C": _problem(dict(base, k=192)),
             "multiple of 8": _problem(dict(base, c=100, k=100, groups=100)),
             "above 11x11": _problem(dict(base, r=13, s=13, pad=6))}
    for words, p in cases.items():
        why = V.supports(p, H200)
        assert not why and words in why.reason, (words, why.reason)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_parameter_set_fits_and_the_default_exists(name, dtype):
    p = _problem(LAYERS[name], dtype)
    g = geometry(p)
    space = list(V.param_space(p, H200))
    assert space and V.default_params(p, H200) in space
    vec = 16 // (4 if dtype == "float32" else 2)
    for params in space:
        threads = params["cb"] // vec * params["th"] * params["tw"] // params["tq"]
        assert 32 <= threads <= 1024
        assert _tile_bytes(g, params["cb"], params["th"], params["tw"], params["tq"],
                           params["tpb"]) <= TILE_SMEM_LIMIT


@pytest.mark.parametrize("name", ["convnext_7x7_96@56", "effnet_5x5s2_144@56",
                                  "mbv2_3x3s2_96@112"])
def test_defaults_build_clean_for_sm90a(name):
    """The unrolled taps of the default tile fit the registers: at most 8 bytes of spill
    (ptxas holds a 256-thread block of the 3x3/2 default at 64 registers, for occupancy, and
    spills one word there), at most 128 registers."""
    compile_ = nvrtc()
    p = _problem(LAYERS[name])
    g, params = geometry(p), V.default_params(p, H200)
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    defines = {
        "DNNCTL_DTYPE": 1, "KR": g.r, "KS": g.s, "STR_H": g.sh, "STR_W": g.sw, "DIL_H": g.dh,
        "DIL_W": g.dw, "VEC": 8, "CB": params["cb"], "TH": params["th"], "TW": params["tw"],
        "TQ": params["tq"], "TPB": params["tpb"],
        "PAD_BYTES": _tile_pad_bytes(params["cb"] * 2, params["tq"] * g.sw)}
    ok, log = compile_(kernels_dir() / "conv2d/depthwise_tile.cu",
                       ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                        f"-I{inc}", "-DDNNCTL_HEADERS=0x0", "--ptxas-options=-v",
                        *(f"-D{k}={v}" for k, v in defines.items())], [])
    assert ok, log
    spill = re.search(r"(\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    assert spill and int(spill.group(1)) <= 8 and regs and int(regs.group(1)) <= 128, log


def test_the_benchmark_times_several_tiles_of_each_layer():
    """benchmarks/bench_depthwise.py: every layer is a problem both variants take, with a
    few block shapes of depthwise_tile besides its default."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_depthwise
    import conv_candidates

    for name, n, c, h, w, r, st, dtype in bench_depthwise.LAYERS:
        p = OP.problem(dict(n=n, c=c, h=h, w=w, k=c, r=r, s=r, stride=st, pad=r // 2,
                            groups=c, dtype=dtype, layout="NHWC"))
        tiles = conv_candidates.shortlist(V, p, H200)
        assert len(tiles) >= 3 and tiles[0] == V.default_params(p, H200), name
        assert conv_candidates.shortlist(get_variant("conv2d", "cupy", "depthwise"), p, H200)


def test_the_data_gradient_variant_takes_stride_one_only():
    """dgrad_depthwise_tile: the forward tile kernel on dy with the filter turned 180 degrees
    (stride 1; the default dgrad stays dgrad_depthwise until measured)."""
    D = get_variant("conv2d", "cupy", "dgrad_depthwise_tile")
    p = OP.problem(dict(LAYERS["convnext_7x7_96@56"], dtype="float16", layout="NHWC",
                        **{"pass": "dgrad"}))
    assert D.supports(p, H200) and D.default_params(p, H200) in list(D.param_space(p, H200))
    strided = OP.problem(dict(LAYERS["effnet_5x5s2_144@56"], dtype="float16", layout="NHWC",
                              **{"pass": "dgrad"}))
    assert "stride 1 only" in D.supports(strided, H200).reason
    assert OP.default_choice(p, "cupy", H200).variant == "dgrad_depthwise"


def test_default_runs_one_tile_a_block():
    """Two tiles a block ran slower on every measured layer: the default keeps one, the
    parameter space keeps two and four for the tuner."""
    for name in LAYERS:
        p = _problem(LAYERS[name])
        assert V.default_params(p, H200)["tpb"] == 1
        assert {q["tpb"] for q in V.param_space(p, H200)} >= {1, 2}


@pytest.mark.parametrize(("pixel_bytes", "step", "pad"), [
    (64, 4, 16), (64, 2, 32), (64, 1, 0), (128, 2, 0), (32, 4, 16)])
def test_window_pad_spreads_a_quarter_warp_over_the_banks(pixel_bytes, step, pad):
    """fp16 CB 32 (64 bytes a pixel): 4 output columns a thread, 16 bytes (the old fixed
    pad); 2 columns, 32 bytes (16 left two thread columns on the same banks); a thread column
    a pixel apart needs none; 8 pieces fill a quarter warp from one pixel (no pad)."""
    assert _tile_pad_bytes(pixel_bytes, step) == pad


# ----------------------------------------------------------------------------- emulator

emu = conv_emu_fixture()


# partial tiles, halos, strides, dilation, every epilogue flag, channels past the last block
FORWARD = [
    (dict(n=2, c=24, h=13, w=11, k=24, r=7, s=7, pad=3, groups=24, bias=True,
          activation="gelu"), "float16"),
    (dict(n=3, c=8, h=12, w=9, k=8, r=5, s=5, stride=2, pad=[2, 1, 2, 0], groups=8,
          residual=True, activation="silu"), "float32"),
    (dict(n=2, c=16, h=10, w=7, k=16, r=3, s=3, dilation=2, pad=2, groups=16, bias=True,
          residual=True, activation="relu6"), "bfloat16"),
    (dict(n=2, c=16, h=10, w=7, k=16, r=3, s=3, pad=1, groups=16, bias=True,
          residual=True, residual_before_act=True, activation="hardswish"), "bfloat16"),
    (dict(n=3, c=40, h=9, w=9, k=40, r=5, s=5, stride=2, pad=2, groups=40, bias=True),
     "float16"),
]
DGRAD = [
    dict(n=2, c=24, h=11, w=13, k=24, r=7, s=7, pad=3, groups=24),  # ConvNeXt-like
    dict(n=1, c=16, h=9, w=10, k=16, r=3, s=3, dilation=2, pad=[2, 1, 2, 0], groups=16),
    dict(n=2, c=8, h=6, w=7, k=8, r=3, s=5, pad=[3, 0, 4, 1], groups=8),  # pads past the filter
]


def _picks(variant, problem, dev):
    """The default, the smallest tile with one, two and four tiles a block (windows that
    alternate, blocks that start mid-image and a last block with fewer tiles)."""
    out = [default_params(variant, problem, dev)]
    for tpb in (1, 2, 4):
        cand = dict(cb=16, th=4, tw=8, tq=2, tpb=tpb)
        if variant.valid_params(problem, cand, dev) and cand not in out:
            out.append(cand)
    return out


@needs_emu
@pytest.mark.parametrize("case", range(len(FORWARD)))
def test_forward_on_cpu_emulator(emu, case):
    key, dtype = FORWARD[case]
    problem = OP.problem(dict(key, dtype=dtype, layout="NHWC"))
    dev = emu.device(0)
    assert V.supports(problem, dev), V.supports(problem, dev).reason
    picks = _picks(V, problem, dev)
    assert any(p["tpb"] > 1 for p in picks)
    for params in picks:
        res = check_variant(OP, problem, V, params, emu, dev, seed=case)
        assert res.ok, f"{params} {problem.short()}: {res.detail}"


@needs_emu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape", range(len(DGRAD)))
def test_dgrad_on_cpu_emulator(emu, shape, dtype):
    """dgrad_depthwise_tile (the forward tile kernel on dy with the filter turned 180
    degrees): odd sizes, dilation, asymmetric pads and pads larger than the filter's reach."""
    variant = get_variant("conv2d", "cupy", "dgrad_depthwise_tile")
    problem = OP.problem(dict(DGRAD[shape], dtype=dtype, layout="NHWC", **{"pass": "dgrad"}))
    dev = emu.device(0)
    assert variant.supports(problem, dev), variant.supports(problem, dev).reason
    for params in _picks(variant, problem, dev):
        res = check_variant(OP, problem, variant, params, emu, dev, seed=shape)
        assert res.ok, f"{params} {problem.short()}: {res.detail}"
